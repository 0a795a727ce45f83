"""linrec.selective_scan (the fused kernels) next to mamba_ssm's selective_scan_fn, in one process, on
Mamba's shapes: batch 8, d in {2048, 5120}, n in {16, 64}, length in {2048, 8192}, and length 65536 at
batch 1; B and C varying (shared by the channels), z, delta_bias and softplus; bfloat16 and float32
(A, D and delta_bias float32). With --complex, a complex A (S4D-Lin's, -1/2 + i pi k) on smaller shapes, B
and C as (real, imag) pairs; with --fixed, B and C fixed (d, n) float32, S4D-style. Times are medians of triton.testing.do_bench; peak memory is what one call
allocates beyond its arguments. Needs a CUDA GPU, triton and mamba_ssm with its CUDA extension:

    python tools/bench_selective_scan.py [--quick] [--complex] [--fixed] [--shapes BxDxNxL ...] [--dtypes bfloat16,...]
                                         [--space] [--json FILE]

--space runs SPACE instead, a grid over what Mamba-1-style models use: every kind of state size from 1 to
256 (odd ones too), B and C fixed, shared and grouped, real and complex A, lengths 1 to 2^20, 256 to
16384 channels, batch 1 to 64, bfloat16, float16 and float32.

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


def space() -> list[tuple[str, str, bool, tuple[int, int, int, int]]]:
    """(dtype, B and C: "shared", "grouped" (4 groups) or "fixed", complex A, (batch, d, n, length)) of the
    --space grid: each axis swept around Mamba's 8 x 2048 x 16 x 2048 in bfloat16 with B and C shared."""
    cases = [("bfloat16", "shared", False, (8, 2048, n, 2048))
             for n in (1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256)]
    cases += [("bfloat16", layout, False, (8, 1024, n, 2048)) for layout in ("grouped", "fixed") for n in (4, 16, 64)]
    cases += [("bfloat16", "shared", True, (8, 1024, n, 2048)) for n in (4, 16, 64)]
    cases += [("bfloat16", "shared", False, (4, 2048, 16, length)) for length in (1, 17, 128, 512, 4096, 65536)]
    cases += [("bfloat16", "shared", False, (1, 1024, 16, 1 << 20))]
    cases += [("bfloat16", "shared", False, (8, d, 16, 2048)) for d in (256, 768, 5000, 16384)]
    cases += [("bfloat16", "shared", False, (batch, 2048, 16, 1024)) for batch in (1, 64)]
    cases += [(dtype, "shared", False, (8, 2048, n, 2048)) for dtype in ("float16", "float32") for n in (4, 16, 64, 128)]
    cases += [("float32", "fixed", False, (8, 1024, 16, 2048)), ("float32", "shared", True, (8, 1024, 16, 2048))]
    return cases


def arguments(batch: int, d: int, n: int, length: int, dtype: torch.dtype, complex_A: bool = False,
              projections: str = "shared") -> list[torch.Tensor]:
    """u, delta, A, B, C, D, z, delta_bias, as Mamba passes them; B and C "shared" (batch, n, length),
    "grouped" (batch, 4, n, length), or "fixed" (d, n) float32, as S4D-style models pass them."""
    def activations():
        return torch.randn(batch, d, length, device="cuda", dtype=dtype)

    if complex_A:
        A = torch.complex(torch.full((d, n), -0.5, device="cuda"), torch.pi * torch.arange(n, device="cuda").expand(d, n))
    else:
        A = -(0.5 + torch.rand(d, n, device="cuda"))
    time_size = 2 * length if complex_A else length

    def projection():
        if projections == "fixed":
            return torch.randn(d, n, device="cuda", dtype=A.dtype)
        if projections == "grouped":
            return torch.randn(batch, 4, n, time_size, device="cuda", dtype=dtype)
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
    parser.add_argument("--space", action="store_true", help="the grid over Mamba-1's space (space())")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    try:
        shapes = ([tuple(int(size) for size in shape.split("x")) for shape in args.shapes] if args.shapes else
                  COMPLEX_SHAPES if args.complex else QUICK_SHAPES if args.quick else SHAPES)
    except ValueError:
        shapes = [()]
    if any(len(shape) != 4 or min(shape) < 1 for shape in shapes):
        parser.error(f"--shapes takes batch x d x n x length, positive, e.g. 8x2048x16x2048; got "
                     f"{' '.join(args.shapes)}")
    dtypes = []
    for name in args.dtypes.split(","):
        if name not in ("bfloat16", "float16", "float32"):
            parser.error(f"--dtypes takes bfloat16, float16 and float32; got {name!r}")
        dtypes.append(name)
    projections = "fixed" if args.fixed else "shared"
    cases = space() if args.space else [(dtype, projections, args.complex, shape) for dtype in dtypes for shape in shapes]
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
    print("| dtype | B and C | A | batch x d x n x length | linrec fwd / fwd+bwd ms | mamba_ssm fwd / fwd+bwd ms "
          "| linrec / mamba_ssm fwd, fwd+bwd | peak MiB fwd+bwd, linrec / mamba_ssm |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    rows = []
    for dtype, layout, complex_A, shape in cases:
        tensors = arguments(*shape, getattr(torch, dtype), complex_A, layout)
        row = {"dtype": dtype, "projections": layout, "complex_A": complex_A, "shape": shape}
        for name, scan in scans.items():
            (fwd, _), (both, peak) = measure(scan, tensors, False), measure(scan, tensors, True)
            row[name] = {"fwd_ms": fwd, "fwdbwd_ms": both, "fwdbwd_peak_mib": peak}
            torch.cuda.empty_cache()
        ours, peer = row["linrec"], row["mamba_ssm"]
        print(f"| {dtype} | {layout} | {'complex' if complex_A else 'real'} | {' x '.join(map(str, shape))} "
              f"| {ours['fwd_ms']:.3f} / {ours['fwdbwd_ms']:.3f} | {peer['fwd_ms']:.3f} / {peer['fwdbwd_ms']:.3f} "
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
