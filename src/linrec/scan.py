"""The public op: ``linrec`` chooses the backend and calls its op, which checks the arguments, or a reference;
``last_states`` reads the state each sequence of its outputs ends in."""

from __future__ import annotations

import torch

from ._core.autograd import COMPILED, apply_forward, direct
from ._core.backend import choose
from ._core.checks import (
    api_error,
    as_bool,
    check_arguments,
    check_cu_seqlens_values,
    check_device_offsets,
    check_initial,
    check_offsets,
    check_packed_layout,
    check_tensor,
    initial_shape,
    normalize_dim,
    typed_arguments,
)
from .reference import REFERENCES, linrec_reference

#: Every value ``backend`` accepts: the compiled kernels ("auto"), the Triton kernels and the pure-PyTorch
#: references.
BACKENDS = ("auto", "triton", *REFERENCES)


def linrec(
    inputs: torch.Tensor,
    coeffs: torch.Tensor | float,
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
            A Python number is a 0-dim decay, of the dtype of ``inputs`` (float32 for 16-bit inputs).
        dim: the time dim along which the recurrence runs (an int, or a numpy integer).
        reverse: run from the last element to the first (``outputs[l] = coeffs[l] * outputs[l+1] + inputs[l]``).
        initial: the state before the first step, of ``inputs``' shape without ``dim``, of the dtype of
            ``inputs`` or, with 16-bit inputs, float32 (its gradient in its dtype). The final state
            is ``outputs.select(dim, -1)`` (``select(dim, 0)`` with ``reverse``): passing it as the next
            chunk's ``initial`` continues the recurrence exactly, for chunked training or streaming
            (:func:`last_states` reads it, for packed sequences too).
        cu_seqlens: packed variable-length sequences along ``dim``, as flash-attention's varlen API takes
            them: int32 or int64 offsets ``[0, end_0, end_1, ..., length]`` (non-decreasing), with
            ``inputs``' dim 0 (the batch dim, before ``dim``) of size 1: a ``(total, channels)`` tensor ``x``
            packed along dim 0 goes in as ``x.unsqueeze(0)`` with ``dim=1``. The recurrence restarts at each
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

    Raises:
        TypeError: an argument of the wrong type or dtype.
        IndexError: ``dim`` out of range.
        ValueError: a wrong value or shape (src/linrec/_core/checks.py states the convention).

    Example:
        >>> x, c = torch.randn(2, 100, 8), torch.rand(8)          # (batch, time, channels), per-channel decay
        >>> y = linrec(x, c, dim=1)
        >>> torch.allclose(y[:, 1], c * x[:, 0] + x[:, 1])
        True
        >>> h = torch.randn(2, 8)                                 # continue from a state
        >>> torch.allclose(linrec(x, c, dim=1, initial=h)[:, 0], c * h + x[:, 0])
        True
    """
    if not (type(dim) is int and type(reverse) is bool and type(log_coeffs) is bool
            and isinstance(coeffs, torch.Tensor)):
        # numpy scalars, a number for coeffs: the types the ops take (their schemas would read 1 as True).
        coeffs, dim, reverse, log_coeffs = typed_arguments("linrec", inputs, coeffs, dim, reverse, initial, cu_seqlens,
                                                           log_coeffs)
    if backend in ("auto", "triton"):
        try:
            return _run_kernels(backend, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
        except (TypeError, ValueError, IndexError, RuntimeError, AttributeError) as error:
            # The op checked its arguments: its error, under linrec's name and as the type its check stands
            # for; arguments of the wrong Python type, which the op's schema refuses in its own words, first.
            typed_arguments("linrec", inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
            translated = api_error("linrec", error)
            if translated is None:
                raise
            raise translated from None
    if backend in REFERENCES:
        dim = check_arguments("linrec", inputs, coeffs, dim, initial, cu_seqlens, log_coeffs)
        if cu_seqlens is not None and not torch.compiler.is_compiling():
            check_cu_seqlens_values("linrec", cu_seqlens, inputs.shape[dim])
        return linrec_reference(REFERENCES[backend], inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
    raise ValueError(f"linrec: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def _run_kernels(backend, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs) -> torch.Tensor:
    """The call on the op family ``backend`` chooses, which checks the arguments. The values of CUDA
    offsets are checked here, once per tensor: an op cannot afford their copy to the host on every call."""
    kernels = COMPILED if backend == "auto" and inputs.is_cpu else choose(backend, inputs)
    if cu_seqlens is not None and cu_seqlens.is_cuda and not torch.compiler.is_compiling():
        check_device_offsets("linrec", cu_seqlens, inputs, dim)
    if direct((inputs, coeffs, initial, cu_seqlens)):
        return apply_forward(kernels, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
    return kernels.forward(inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)


def last_states(
    outputs: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    dim: int = -1,
    reverse: bool = False,
    initial: torch.Tensor | None = None,
) -> torch.Tensor:
    """The state each sequence of a :func:`linrec` call ends in: what to pass as the next chunk's ``initial``.

    Takes the call's ``outputs`` and the ``cu_seqlens``, ``dim``, ``reverse`` and ``initial`` it was given. The
    state after a sequence's last step is its last output (its first with ``reverse``, the scan's last step);
    a sequence without steps keeps the state it started from, its row of ``initial``, zeros without one,
    exactly as :func:`linrec` continues from it. Differentiable in ``outputs`` and ``initial``.

    Args:
        outputs: the outputs of a :func:`linrec` call.
        cu_seqlens: its packed sequences' offsets ``[0, end_0, ..., length]`` (``outputs`` then has a batch dim
            0 of size 1 before ``dim``), or None: every row of ``outputs`` along ``dim`` is one sequence.
        dim: its time dim.
        reverse: whether it ran from the last element to the first.
        initial: its initial state, of ``outputs``' shape without ``dim`` (with ``cu_seqlens``, dim 0 counts the
            sequences), of ``outputs``' dtype or, for 16-bit outputs, float32; or None (zeros).

    Returns:
        The final states, of ``initial``'s shape: ``outputs``' without ``dim``, dim 0 counting the sequences
        with ``cu_seqlens``; in ``outputs``' dtype, in memory of their own (holding them does not keep
        ``outputs`` alive).

    Raises:
        TypeError: an argument of the wrong type or dtype, as :func:`linrec` does.
        IndexError: ``dim`` out of range.
        ValueError: a wrong value or shape, as :func:`linrec` does; also offsets that do not run from 0 to the
            length of ``dim`` without decreasing (checked on the host, once per tensor, outside ``torch.compile``).

    Example:
        >>> x, c = torch.randn(1, 6, 2), torch.rand(1, 6, 2)        # 3 sequences packed along dim 1
        >>> cu_seqlens = torch.tensor([0, 4, 4, 6])                 # the middle one empty
        >>> h = torch.randn(3, 2)
        >>> y = linrec(x, c, dim=1, initial=h, cu_seqlens=cu_seqlens)
        >>> states = last_states(y, cu_seqlens, dim=1, initial=h)   # (3, 2)
        >>> torch.equal(states[0], y[0, 3]), torch.equal(states[1], h[1]), torch.equal(states[2], y[0, 5])
        (True, True, True)
    """
    op = "linrec.last_states"
    check_tensor(op, "outputs", outputs)
    if outputs.dim() == 0:
        raise ValueError(f"{op}: outputs must have at least one dim (the time dim), got a 0-dim tensor")
    dim = normalize_dim(op, dim, outputs.dim())
    reverse = as_bool(op, "reverse", reverse)
    if cu_seqlens is not None:
        check_offsets(op, cu_seqlens, "outputs", outputs)
        check_packed_layout(op, "outputs", outputs, dim)
        if not torch.compiler.is_compiling():
            check_cu_seqlens_values(op, cu_seqlens, outputs.shape[dim])
    if initial is not None:
        check_initial(op, initial, "outputs", outputs, dim, cu_seqlens)
    return final_states(outputs, cu_seqlens, dim, reverse, initial)


def final_states(outputs: torch.Tensor, cu_seqlens: torch.Tensor | None, dim: int, reverse: bool,
                 initial: torch.Tensor | None) -> torch.Tensor:
    """:func:`last_states` of arguments already checked (``dim`` in [0, outputs.dim())), for the layers."""
    length = outputs.shape[dim]
    if length == 0:  # every sequence is empty
        shape = initial_shape(outputs, dim, cu_seqlens)
        return outputs.new_zeros(shape) if initial is None else initial.to(outputs.dtype, copy=True)
    if cu_seqlens is None:
        return outputs.select(dim, 0 if reverse else length - 1).clone()
    starts, ends = cu_seqlens[:-1], cu_seqlens[1:]
    # outputs is (1, ..., length at dim, ...): each sequence's last step of the scan (an empty one's index
    # clamped into range, its value replaced below), then the sequences moved to dim 0.
    last_steps = (starts if reverse else ends - 1).clamp(0, length - 1)
    picked = outputs.index_select(dim, last_steps).squeeze(0).movedim(dim - 1, 0)
    kept = picked.new_zeros(()) if initial is None else initial.to(outputs.dtype)
    empty = (starts == ends).view(-1, *[1] * (picked.dim() - 1))
    return torch.where(empty, kept, picked)
