"""linrec.selective_scan (the fused kernels) next to mamba_ssm's selective_scan_fn, in one process, on
Mamba's shapes: batch 8, d in {2048, 5120}, n in {16, 64}, length in {2048, 8192}, and length 65536 at
batch 1; B and C varying (shared by the channels), z, delta_bias and softplus; bfloat16 and float32
(A, D and delta_bias float32). With --complex, a complex A (S4D-Lin's, -1/2 + i pi k) on smaller shapes, B
and C as (real, imag) pairs; with --fixed, B and C fixed (d, n) float32, S4D-style. Times are medians of triton.testing.do_bench; peak memory is what one call
allocates beyond its arguments. Needs a CUDA GPU, triton and mamba_ssm with its CUDA extension:

    python tools/bench_selective_scan.py [--quick] [--complex] [--fixed] [--shapes BxDxNxL ...] [--dtypes bfloat16,...]
                                         [--json FILE]

Prints a Markdown table (docs/benchmarks.md, Selective scan).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

import linrec
from linrec.tools.bench import mamba_selective_scan

SHAPES = ([(8, d, n, length) for d in (2048, 5120) for n in (16, 64) for length in (2048, 8192)]
          + [(1, d, n, 65536) for d in (2048, 5120) for n in (16, 64)])
QUICK_SHAPES = [(8, 2048, 16, 2048), (8, 5120, 16, 8192), (8, 2048, 64, 2048)]
COMPLEX_SHAPES = [(8, 1024, 16, 2048), (8, 2048, 16, 2048), (8, 1024, 64, 2048), (1, 2048, 16, 65536)]


def arguments(batch: int, d: int, n: int, length: int, dtype: torch.dtype, complex_A: bool = False,
              fixed: bool = False) -> list[torch.Tensor]:
    """u, delta, A, B, C, D, z, delta_bias, as Mamba passes them; with ``fixed``, B and C (d, n) float32, as
    S4D-style models pass them."""
    def activations():
        return torch.randn(batch, d, length, device="cuda", dtype=dtype)

    if complex_A:
        A = torch.complex(torch.full((d, n), -0.5, device="cuda"), torch.pi * torch.arange(n, device="cuda").expand(d, n))
    else:
        A = -(0.5 + torch.rand(d, n, device="cuda"))
    time_size = 2 * length if complex_A else length

    def projection():
        if fixed:
            return torch.randn(d, n, device="cuda", dtype=A.dtype)
        return torch.randn(batch, n, time_size, device="cuda", dtype=dtype)

    return [activations(), (0.5 * torch.randn(batch, d, length, device="cuda") - 1).to(dtype), A, projection(),
            projection(),
            torch.randn(d, device="cuda"), activations(), 0.3 * torch.randn(d, device="cuda")]


def measure(scan, tensors: list[torch.Tensor], backward: bool) -> tuple[float, float]:
    """(median ms, peak MiB beyond the arguments) of a forward, or of a forward and backward."""
    leaves = [tensor.detach().requires_grad_(backward) for tensor in tensors]
    if backward:
        d_out = torch.randn_like(scan(*leaves))

        def step():
            torch.autograd.grad(scan(*leaves), leaves, d_out)
    else:
        def step():
            with torch.no_grad():
                scan(*leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three shapes instead of the twelve")
    parser.add_argument("--complex", action="store_true", help="a complex A, on smaller shapes")
    parser.add_argument("--fixed", action="store_true", help="B and C fixed (d, n), S4D-style")
    parser.add_argument("--shapes", nargs="+", metavar="BxDxNxL",
                        help="batch x d x n x length of each case, instead of the built-in shapes")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated, of u, delta, B, C and z")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    shapes = ([tuple(int(size) for size in shape.split("x")) for shape in args.shapes] if args.shapes else
              COMPLEX_SHAPES if args.complex else QUICK_SHAPES if args.quick else SHAPES)
    if any(len(shape) != 4 for shape in shapes):
        parser.error(f"--shapes takes batch x d x n x length, e.g. 8x2048x16x2048; got {' '.join(args.shapes)}")
    dtypes = []
    for name in args.dtypes.split(","):
        if name not in ("bfloat16", "float16", "float32"):
            parser.error(f"--dtypes takes bfloat16, float16 and float32; got {name!r}")
        dtypes.append(getattr(torch, name))
    theirs = mamba_selective_scan()
    if theirs is None:
        raise SystemExit("mamba_ssm with its CUDA extension is not installed")
    scans = {"linrec": lambda *tensors: linrec.selective_scan(*tensors, True),
             "mamba_ssm": lambda *tensors: theirs(*tensors, True)}
    print(f"linrec {linrec.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    # A second of matrix products first: measured on an idle GPU, the first row runs at lower clocks.
    warm = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):
        warm = warm @ warm
        warm /= warm.norm()
    torch.cuda.synchronize()
    print("| dtype | batch x d x n x length | linrec fwd / fwd+bwd ms | mamba_ssm fwd / fwd+bwd ms "
          "| linrec / mamba_ssm fwd, fwd+bwd | peak MiB fwd+bwd, linrec / mamba_ssm |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            tensors = arguments(*shape, dtype, args.complex, args.fixed)
            row = {"dtype": str(dtype).removeprefix("torch."), "shape": shape}
            for name, scan in scans.items():
                (fwd, _), (both, peak) = measure(scan, tensors, False), measure(scan, tensors, True)
                row[name] = {"fwd_ms": fwd, "fwdbwd_ms": both, "fwdbwd_peak_mib": peak}
                torch.cuda.empty_cache()
            ours, peer = row["linrec"], row["mamba_ssm"]
            print(f"| {row['dtype']} | {' x '.join(map(str, shape))} | {ours['fwd_ms']:.2f} / {ours['fwdbwd_ms']:.2f} "
                  f"| {peer['fwd_ms']:.2f} / {peer['fwdbwd_ms']:.2f} "
                  f"| {ours['fwd_ms'] / peer['fwd_ms']:.2f}, {ours['fwdbwd_ms'] / peer['fwdbwd_ms']:.2f} "
                  f"| {ours['fwdbwd_peak_mib']:.0f} / {peer['fwdbwd_peak_mib']:.0f} |", flush=True)
            rows.append(row)
            del tensors
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
