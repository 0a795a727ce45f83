"""The public op: ``linrec`` chooses the backend and calls its op, which checks the arguments, or a reference."""

from __future__ import annotations

import torch

from ._core.autograd import COMPILED, apply_forward, direct
from ._core.backend import choose
from ._core.checks import (
    api_error,
    check_argument_types,
    check_arguments,
    check_bool,
    check_cu_seqlens_values,
    check_device_offsets,
)
from .reference import REFERENCES, linrec_reference

#: Every value ``backend`` accepts: the compiled kernels ("auto"), the Triton kernels and the pure-PyTorch
#: references.
BACKENDS = ("auto", "triton", *REFERENCES)


def linrec(
    inputs: torch.Tensor,
    coeffs: torch.Tensor,
    dim: int = -1,
    reverse: bool = False,
    initial: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    log_coeffs: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """Computes the linear recurrence ``outputs[l] = coeffs[l] * outputs[l-1] + inputs[l]`` along ``dim``.

    The recurrence starts at ``outputs[0] = coeffs[0] * initial + inputs[0]``; without ``initial`` at
    ``outputs[0] = inputs[0]``, and ``coeffs[0]`` then takes no part (its gradient is zero).
    Differentiable in ``inputs``, ``coeffs`` and ``initial`` (complex ones in PyTorch's convention), and
    traceable by ``torch.compile`` (``fullgraph=True``, dynamic shapes too). The kernels read every
    operand through its strides: no operand is copied or expanded.

    Args:
        inputs: the additive terms x, any shape, float32, float64, float16, bfloat16 (16-bit types
            accumulate in float32), complex64 or complex128.
        coeffs: the multiplicative coefficients c, on the device of ``inputs``, of its dtype or, with
            float16 or bfloat16 inputs, float32 (mixed precision: decays such as 0.999, which bfloat16
            stores as 1.0, keep their precision; the kernels then read coeffs and initial in float32),
            of a shape that broadcasts to it: a 0-dim scalar, one per channel (time-invariant filters),
            one per (batch, time) shared by channels, ... The gradient comes back in this shape and dtype.
        dim: the time dim along which the recurrence runs.
        reverse: run from the last element to the first (``outputs[l] = coeffs[l] * outputs[l+1] + inputs[l]``).
        initial: the state before the first step, of ``inputs``' shape without ``dim``, of the dtype of
            ``inputs`` or, with 16-bit inputs, float32 (its gradient in its dtype). The final state
            is ``outputs.select(dim, -1)`` (``select(dim, 0)`` with ``reverse``): passing it as the next
            chunk's ``initial`` continues the recurrence exactly, for chunked training or streaming.
        cu_seqlens: packed variable-length sequences along ``dim``, as flash-attention's varlen API takes
            them: int32 or int64 offsets ``[0, end_0, end_1, ..., length]`` (non-decreasing), with
            ``inputs``' dim 0 (the batch dim, before ``dim``) of size 1. The recurrence restarts at each
            boundary and no gradient crosses it; ``initial``'s dim 0 then counts the sequences. The
            offsets are checked on the host (one small copy from the GPU) outside ``torch.compile``.
        log_coeffs: ``coeffs`` hold ``log c`` (real types only), as log-space gates produce them; the
            kernels exponentiate, and the gradient is with respect to the log coefficients.
        backend: ``"auto"`` for the compiled CPU/CUDA kernels (the Triton kernels on a GPU they do not run on,
            where triton is installed: ROCm, an architecture the build has no code for, a CPU-only build);
            ``"triton"`` for the Triton kernels (real dtypes; on the CPU under ``TRITON_INTERPRET=1``); or a
            reference implementation by name: ``"loop"``, ``"hop"`` (torch's associative_scan) or
            ``"heinsen"`` (log space).

    Returns:
        outputs, with the shape, dtype and device of ``inputs``.

    Example:
        >>> x, c = torch.randn(2, 100, 8), torch.rand(8)          # (batch, time, channels), per-channel decay
        >>> y = linrec(x, c, dim=1)
        >>> torch.allclose(y[:, 1], c * x[:, 0] + x[:, 1])
        True
        >>> h = torch.randn(2, 8)                                 # continue from a state
        >>> torch.allclose(linrec(x, c, dim=1, initial=h)[:, 0], c * h + x[:, 0])
        True
    """
    if backend in ("auto", "triton"):
        try:
            return _run_kernels(backend, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
        except (TypeError, ValueError, IndexError, RuntimeError, AttributeError) as error:
            # The op checked its arguments: its error, under linrec's name and as the type its check stands
            # for; arguments of the wrong Python type, which the op's schema refuses in its own words, first.
            check_argument_types("linrec", inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
            translated = api_error("linrec", error)
            if translated is None:
                raise
            raise translated from None
    if backend in REFERENCES:
        dim = check_arguments("linrec", inputs, coeffs, dim, initial, cu_seqlens, log_coeffs)
        check_bool("linrec", "reverse", reverse)
        if cu_seqlens is not None and not torch.compiler.is_compiling():
            check_cu_seqlens_values("linrec", cu_seqlens, inputs.shape[dim])
        return linrec_reference(REFERENCES[backend], inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
    raise ValueError(f"linrec: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def _run_kernels(backend, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs) -> torch.Tensor:
    """The call on the op family ``backend`` chooses, which checks the arguments. The values of CUDA
    offsets are checked here, once per tensor: an op cannot afford their copy to the host on every call."""
    if type(dim) is not int or type(reverse) is not bool or type(log_coeffs) is not bool:
        check_argument_types("linrec", inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)  # schemas take 1 as True
    kernels = COMPILED if backend == "auto" and inputs.is_cpu else choose(backend, inputs)
    if cu_seqlens is not None and cu_seqlens.is_cuda and not torch.compiler.is_compiling():
        check_device_offsets("linrec", cu_seqlens, inputs, dim)
    if direct((inputs, coeffs, initial, cu_seqlens)):
        return apply_forward(kernels, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
    return kernels.forward(inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
