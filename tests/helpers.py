"""Input generation and comparison against the float64 reference, shared by the test files."""

from __future__ import annotations

import torch

from linrec import linrec_loop

#: Max error over max |reference|, for outputs computed from inputs already rounded to the dtype:
#: what remains is float32 (float64) accumulation and the final rounding to the dtype.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOLERANCE)


def random_operands(shape, dtype, device, requires_grad=False):
    """inputs ~ N(0, 1) and coeffs ~ U(-1, 1): both signs, never all zeros, stable recurrences."""
    inputs = torch.randn(shape, dtype=torch.float64).to(dtype)
    coeffs = (torch.rand(shape, dtype=torch.float64) * 2 - 1).to(dtype)
    return (inputs.to(device).requires_grad_(requires_grad), coeffs.to(device).requires_grad_(requires_grad))


def reference(inputs, coeffs, dim=-1, reverse=False):
    """The loop recurrence in float64 on the CPU, from the same (already rounded) values."""
    inputs64 = inputs.detach().cpu().double().movedim(dim, -1)
    coeffs64 = coeffs.detach().cpu().double().movedim(dim, -1)
    return linrec_loop(inputs64, coeffs64, reverse).movedim(-1, dim)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "outputs"):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if expected.numel() == 0:
        return
    actual = actual.detach().cpu().double()
    assert torch.isfinite(actual).all(), f"{what}: {(~torch.isfinite(actual)).sum().item()} non-finite elements"
    scale = expected.abs().max().clamp_min(1e-30)
    error = ((actual - expected).abs().max() / scale).item()
    assert error <= TOLERANCE[dtype], f"{what}: max error / max |ref| = {error:.3g} > {TOLERANCE[dtype]:.3g} ({dtype})"
