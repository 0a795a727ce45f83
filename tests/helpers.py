"""Input generation and comparison against the float64 (complex128) reference, shared by the test files."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

import linrec
from linrec import linrec_loop, linrec_reference
from linrec.tools.tune import PACKED_BACKWARD_TILE_SHAPES

#: Max error over max |reference|, for outputs computed from inputs already rounded to the dtype:
#: what remains is float32 (float64) accumulation and the final rounding to the dtype.
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.complex64: 2e-5,
    torch.complex128: 1e-12,
}
DTYPES = list(TOLERANCE)
REAL_DTYPES = [dtype for dtype in DTYPES if not dtype.is_complex]


def wide(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A detached float64 (complex128) copy on the CPU, for the reference."""
    if tensor is None:
        return None
    return tensor.detach().cpu().to(torch.complex128 if tensor.is_complex() else torch.float64)


def random_values(shape, dtype, device="cpu", requires_grad=False):
    """~ N(0, 1) (complex: both parts), never all zeros."""
    if dtype.is_complex:
        values = torch.randn(shape, dtype=torch.complex128)
    else:
        values = torch.randn(shape, dtype=torch.float64)
    return values.to(dtype).to(device).requires_grad_(requires_grad)


def random_coeffs(shape, dtype, device="cpu", requires_grad=False, min_magnitude=0.0):
    """|c| ~ U(min_magnitude, 1) with a random sign (complex: a random phase): stable recurrences, both
    signs. Near 1, products of many coefficients stay away from 0 (long memory)."""
    magnitude = min_magnitude + (1 - min_magnitude) * torch.rand(shape, dtype=torch.float64)
    if dtype.is_complex:
        coeffs = torch.polar(magnitude, torch.rand(shape, dtype=torch.float64) * 2 * math.pi)
    else:
        coeffs = magnitude * (torch.randint(0, 2, shape) * 2 - 1)
    return coeffs.to(dtype).to(device).requires_grad_(requires_grad)


def random_operands(shape, dtype, device, requires_grad=False):
    """inputs ~ N(0, 1) and coeffs of magnitude < 1, of one shape."""
    return random_values(shape, dtype, device, requires_grad), random_coeffs(shape, dtype, device, requires_grad)


def reference(inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None, log_coeffs=False):
    """The loop recurrence in float64 (complex128) on the CPU, from the same (already rounded) values."""
    return linrec_reference(
        linrec_loop, wide(inputs), wide(coeffs), dim, reverse, wide(initial),
        None if cu_seqlens is None else cu_seqlens.cpu(), log_coeffs,
    )


def reference_gradients(d_outputs, inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None, log_coeffs=False):
    """Autograd through the float64 loop: gradients of inputs, coeffs and (when given) initial."""
    leaves = [wide(t).requires_grad_() for t in (inputs, coeffs, initial) if t is not None]
    offsets = None if cu_seqlens is None else cu_seqlens.cpu()
    state = leaves[2] if initial is not None else None
    outputs = linrec_reference(linrec_loop, leaves[0], leaves[1], dim, reverse, state, offsets, log_coeffs)
    return torch.autograd.grad(outputs, leaves, wide(d_outputs), allow_unused=True, materialize_grads=True)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "outputs",
                   terms: int = 1):
    """``actual`` within the dtype's tolerance of ``expected``, relative to its largest value. ``terms``: how many
    values each element sums (a parameter's gradient sums one a step); the rounding error of a sum grows like the
    square root of its count, and its cancellation leaves a small result, so the tolerance grows beyond 64 terms."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if expected.numel() == 0:
        return
    actual = actual.detach().cpu().to(expected.dtype)
    assert torch.isfinite(actual).all(), f"{what}: {(~torch.isfinite(actual)).sum().item()} non-finite elements"
    scale = expected.abs().max().clamp_min(1e-30)
    error = ((actual - expected).abs().max() / scale).item()
    tolerance = TOLERANCE[dtype] * max(1.0, (terms / 64) ** 0.5)
    assert error <= tolerance, f"{what}: max error / max |ref| = {error:.3g} > {tolerance:.3g} ({dtype})"


def check_against_reference(inputs, coeffs, dtype, dim=-1, reverse=False, initial=None, cu_seqlens=None, log_coeffs=False,
                            backend="auto"):
    """Outputs and every gradient (inputs, coeffs, initial) of a backend's kernels against the reference."""
    kwargs = dict(dim=dim, reverse=reverse, initial=initial, cu_seqlens=cu_seqlens, log_coeffs=log_coeffs)
    leaves = [t for t in (inputs, coeffs, initial) if t is not None]
    for leaf in leaves:
        leaf.requires_grad_()
    outputs = linrec.linrec(inputs, coeffs, **kwargs, backend=backend)
    assert outputs.shape == inputs.shape and outputs.dtype == dtype
    assert_matches(outputs, reference(inputs, coeffs, **kwargs), dtype)
    d_outputs = random_values(outputs.shape, dtype, outputs.device)
    grads = torch.autograd.grad(outputs, leaves, d_outputs)
    expected = reference_gradients(d_outputs, inputs, coeffs, **kwargs)
    for name, grad, leaf, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads, leaves, expected):
        assert grad.shape == leaf.shape, f"{name}: shape {tuple(grad.shape)} != {tuple(leaf.shape)}"
        if name == "d_coeffs" and coeffs.shape != inputs.shape:
            assert_sum_matches(grad, want, d_outputs, inputs, coeffs, dtype, kwargs)
        else:
            assert_matches(grad, want, dtype, name)


def assert_sum_matches(grad, want, d_outputs, inputs, coeffs, dtype, kwargs):
    """A broadcast coefficient's gradient is a sum of per-element terms, each rounded to the dtype (as
    in PyTorch's own backward of a broadcast product): its error scales with the sum of the terms'
    magnitudes, not with the sum, which cancels towards 0 under random upstream gradients."""
    full = reference_gradients(d_outputs, inputs, coeffs.expand(inputs.shape), **kwargs)[1]
    scale = full.abs().sum_to_size(coeffs.shape).max().clamp_min(1e-30)
    error = ((grad.detach().cpu().to(want.dtype) - want).abs().max() / scale).item()
    assert error <= TOLERANCE[dtype], f"d_coeffs: max error / sum |terms| = {error:.3g} > {TOLERANCE[dtype]:.3g} ({dtype})"


def strided_view(shape, dtype, device, kind, make=random_values):
    """A tensor of `shape` whose memory is not contiguous in that order."""
    if kind == "contiguous":
        return make(shape, dtype, device)
    if kind == "transposed":  # the memory holds the last two dims swapped
        return make((*shape[:-2], shape[-1], shape[-2]), dtype, device).transpose(-1, -2)
    if kind == "sliced":  # every other element of the last dim, and an offset start
        return make((*shape[:-1], 2 * shape[-1] + 1), dtype, device)[..., 1::2]
    raise ValueError(kind)


_HAS_TRITON = importlib.util.find_spec("triton") is not None
_INTERPRETED = _HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"

#: Whether the Triton kernels run compiled on a GPU here.
TRITON_ON_GPU = _HAS_TRITON and torch.cuda.is_available() and not _INTERPRETED

#: The devices the Triton kernels run on here: CPU tensors through Triton's interpreter (no GPU), or the GPU.
TRITON_DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not _INTERPRETED, reason="needs triton, on its interpreter (no GPU)")),
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not TRITON_ON_GPU, reason="needs triton and a GPU")]),
]


def triton_runs_on(device: str) -> bool:
    """Whether the Triton kernels run on `device` here: compiled on the GPU, or through the interpreter on the CPU."""
    return TRITON_ON_GPU if device == "cuda" else _INTERPRETED


# The CUDA kernel checks shared by the test files of each kernel family.


def misaligned_copy(tensor):
    """A contiguous copy whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    copy = storage[1:].view(tensor.shape)
    copy.copy_(tensor)
    return copy


def poison_free_memory(numel, dtype):
    """Fills memory the caching allocator will hand out next with NaN, so that an element a kernel
    leaves unwritten shows up as non-finite rather than as a stale value."""
    torch.full((4 * numel + 1024,), float("nan"), dtype=dtype, device="cuda")
    torch.cuda.synchronize()


def check_with_features(inputs, coeffs, dim, reverse, log_coeffs=False, offsets=None, config=(0, 0),
                        with_initial=True):
    """Forward and backward (with an initial state unless with_initial is False; over the packed sequences
    of `offsets` if given; in a forced tile config if given), on poisoned memory, against the CPU kernels
    in float64."""
    dtype = inputs.dtype
    state_shape = list(inputs.shape)
    del state_shape[dim]
    if offsets is not None:
        state_shape[0] = len(offsets) - 1
    initial = random_values(state_shape, dtype, "cuda") if with_initial else None
    d_outputs = random_values(inputs.shape, dtype, "cuda")
    options = dict(dim=dim, reverse=reverse, initial=initial, log_coeffs=log_coeffs)
    if offsets is not None:
        options["cu_seqlens"] = offsets.cuda()
    forced = dict(threads_per_sequence=config[0], vectors_per_thread=config[1])
    poison_free_memory(inputs.numel(), dtype)
    outputs = torch.ops.linrec.forward(inputs, coeffs, **options, **forced)
    if offsets is not None and config != (0, 0) and config not in PACKED_BACKWARD_TILE_SHAPES:
        # The packed backward is compiled for the largest row tiles only: a smaller forced one is
        # refused, and the automatic config is checked instead.
        with pytest.raises(ValueError, match=r"no backward kernel is compiled for config \{threads_per_sequence="
                                             rf"{config[0]}, vectors_per_thread={config[1]},"):
            torch.ops.linrec.backward(d_outputs, coeffs, outputs, **options, **forced)
        forced = {}
    poison_free_memory(inputs.numel(), dtype)
    grads = torch.ops.linrec.backward(d_outputs, coeffs, outputs, **options, **forced)
    wide_options = dict(options, initial=wide(initial))
    if offsets is not None:
        wide_options["cu_seqlens"] = offsets.cpu()
    expected_outputs = torch.ops.linrec.forward(wide(inputs), wide(coeffs), **wide_options)
    expected = torch.ops.linrec.backward(wide(d_outputs), wide(coeffs), expected_outputs, **wide_options)
    what = f"{tuple(inputs.shape)} dim={dim} coeffs {tuple(coeffs.shape)} config {config}"
    if offsets is not None:
        what += f" {len(offsets) - 1} sequences"
    assert_matches(outputs, expected_outputs, dtype, f"outputs {what}")
    for name, grad, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads, expected):
        assert_matches(grad, want, dtype, f"{name} {what}")


def packed_offsets(length, tile, items, dense_tiles=2):
    """cu_seqlens for one row of `length`: sequence boundaries at, before and after every chunk
    boundary (every `items` elements) of the first `dense_tiles` tiles and every tile boundary after,
    sequences of length 1 at both ends, and empty sequences at the start, at the first tile boundary
    and at the end."""
    edges = [*range(items, min(length, dense_tiles * tile), items), *range(tile, length, tile)]
    cuts = {1, length - 1} | {edge + step for edge in edges for step in (-1, 0, 1)}
    offsets = sorted([0, 0, *(cut for cut in cuts if 0 < cut < length), min(tile, length), length, length])
    return torch.tensor(offsets, dtype=torch.int32)


def use_instruction_set(monkeypatch: pytest.MonkeyPatch, isa: str) -> None:
    """Runs the CPU kernels compiled for `isa` (LINREC_CPU_ISA) for the rest of the test, or skips the
    test where this CPU lacks it."""
    monkeypatch.setenv("LINREC_CPU_ISA", isa)
    try:
        linrec.linrec(torch.ones(3), torch.ones(3))
    except ValueError as error:
        if "this CPU lacks" in str(error):
            pytest.skip(str(error))
        raise
