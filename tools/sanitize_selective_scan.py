"""Forward and backward calls of the fused selective scan on the GPU that reach each of its kernels: every
lane policy (one state dim a lane at n <= 4, four up to 16, sixteen lanes up to 64, the forward's blocks
of eight warps, sixteen lanes of one dim for few channels), B and C varying or fixed, packed sequences,
rows split along time, the deterministic backward, the block kernels (one of B and C fixed, n > 64,
complex A, float64) and the decode step's kernels. Each output is compared with the float64 loop, so that
a run under compute-sanitizer also checks the values:

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 \\
        python tools/sanitize_selective_scan.py [--only WORD,...]
    compute-sanitizer --tool racecheck --error-exitcode 3 python tools/sanitize_selective_scan.py

Exits non-zero on a mismatch. Sizes are small, so that the tools' slowdown leaves a run of minutes.
"""
from __future__ import annotations

import argparse
import sys

import torch

import linrec


def arguments(batch: int, d: int, n: int, length: int, projections: str, dtype=torch.float32, complex_A=False):
    """u, delta, A, B, C, D, z, delta_bias: B and C "varying" (batch, 1, n, length), "fixed" (d, n), or "mixed"."""
    generator = torch.Generator().manual_seed(batch * 1009 + d * 31 + n * 7 + length)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)

    A = -(0.5 + torch.rand(d, n, generator=generator, dtype=torch.float64)).to(torch.float32)
    if complex_A:
        A = torch.complex(A, randn(d, n))
    fixed_dtype = A.dtype
    time_size = 2 * length if complex_A else length  # a complex A's varying B and C: (real, imag) pairs
    B = randn(d, n, dtype=fixed_dtype) if projections == "fixed" else randn(batch, 1, n, time_size, dtype=dtype)
    C = (randn(d, n, dtype=fixed_dtype) if projections in ("fixed", "mixed") else
         randn(batch, 1, n, time_size, dtype=dtype))
    return [randn(batch, d, length, dtype=dtype), (0.5 * randn(batch, d, length) - 1).to(dtype), A, B, C,
            randn(d), randn(batch, d, length, dtype=dtype), 0.3 * randn(d)]


def check(name: str, tensors: list[torch.Tensor], cu_seqlens: list[int] | None = None, deterministic=False) -> bool:
    """One forward and backward on the GPU against the loop over time in float64 on the CPU (backend
    "loop"); prints the case and the largest error."""
    offsets = None if cu_seqlens is None else torch.tensor(cu_seqlens)
    wide = [t.to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_() for t in tensors]
    expected = linrec.selective_scan(*wide, delta_softplus=True, cu_seqlens=offsets, backend="loop")
    d_out = torch.randn(expected.shape, dtype=torch.float64)
    expected_grads = torch.autograd.grad(expected, wide, d_out)
    leaves = [t.cuda().requires_grad_() for t in tensors]
    torch.use_deterministic_algorithms(deterministic)
    try:
        out = linrec.selective_scan(*leaves, delta_softplus=True,
                                    cu_seqlens=None if offsets is None else offsets.cuda())
        grads = torch.autograd.grad(out, leaves, d_out.to(out.dtype).cuda())
    finally:
        torch.use_deterministic_algorithms(False)
    error = 0.0
    for actual, want in zip((out, *grads), (expected, *expected_grads)):
        scale = want.abs().max().item() or 1.0
        error = max(error, (actual.cpu().to(want.dtype) - want).abs().max().item() / scale)
    bound = 2e-2 if tensors[0].dtype in (torch.bfloat16, torch.float16) else 1e-4
    ok = error <= bound
    print(f"{'ok  ' if ok else 'FAIL'} {name}: largest error {error:.1e} of the largest value (bound {bound:.0e})",
          flush=True)
    return ok


def check_steps() -> bool:
    """Decode steps from a state against the scan of the same steps (the lane kernels' bits at n <= 64)."""
    ok = True
    for n in (4, 16, 128):
        tensors = [t.cuda() for t in arguments(2, 64, n, 3, "varying")]
        u, delta, A, B, C, D, z, delta_bias = tensors
        initial = torch.randn(2, 64, n, device="cuda")
        out, last = linrec.selective_scan(*tensors, delta_softplus=True, return_last_state=True, initial=initial)
        state = initial.clone()
        steps = torch.stack([linrec.selective_state_update(state, u[..., t], delta[..., t], A, B[:, 0, :, t],
                                                           C[:, 0, :, t], D, z[..., t], delta_bias, True)
                             for t in range(3)], dim=-1)
        error = max((steps - out).abs().max().item(), (state - last).abs().max().item())
        ok &= error <= 1e-5
        print(f"{'ok  ' if error <= 1e-5 else 'FAIL'} decode steps, n = {n}: largest difference {error:.1e}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated words: run the cases whose names hold one of them")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    words = args.only.split(",") if args.only else None
    selected = (lambda name: words is None or any(word in name for word in words))
    cases = [
        ("lanes, one state dim a lane (n = 3)", arguments(2, 2048, 3, 600, "varying"), None, False),
        ("lanes, four state dims a lane (n = 16)", arguments(2, 2048, 16, 600, "varying"), None, False),
        ("lanes, sixteen lanes a channel (n = 40)", arguments(4, 2048, 40, 40, "varying"), None, False),
        ("lanes, bfloat16 (n = 16)", arguments(2, 2048, 16, 300, "varying", torch.bfloat16), None, False),
        ("lanes, few channels (n = 16)", arguments(1, 6, 16, 1100, "varying"), None, False),
        ("lanes, a row split along time (n = 40)", arguments(1, 512, 40, 1100, "varying"), None, False),
        ("lanes, fixed B and C (n = 16)", arguments(2, 2048, 16, 600, "fixed"), None, False),
        ("lanes, fixed B and C, split (n = 40)", arguments(1, 512, 40, 1100, "fixed"), None, False),
        ("lanes, packed sequences", arguments(1, 1024, 4, 600, "varying"), [0, 0, 17, 17, 40, 600], False),
        ("lanes, deterministic backward", arguments(2, 70, 16, 1100, "varying"), None, True),
        ("blocks, B fixed and C varying", arguments(2, 64, 16, 600, "mixed"), None, False),
        ("blocks, n = 65", arguments(2, 16, 65, 600, "varying"), None, False),
        ("blocks, complex A", arguments(2, 16, 8, 600, "varying", complex_A=True), None, False),
        ("blocks, float64", arguments(2, 16, 8, 600, "varying", torch.float64), None, False),
    ]
    ok = True
    for name, tensors, offsets, deterministic in cases:
        if selected(name):
            ok &= check(name, tensors, offsets, deterministic)
    if selected("decode steps"):
        ok &= check_steps()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
