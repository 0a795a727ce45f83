"""Mamba's causal depthwise convolution over time, with packed sequences, states and a decode step.

Each channel ``c`` of ``x`` (batch, dim, length) is filtered by its own kernel ``weight[c]`` of ``width`` taps,
causally: the output at step ``t`` reads the inputs at steps ``t - width + 1`` to ``t``::

    out[b, c, t] = activation(bias[c] + sum over k of weight[c, k] * x[b, c, t - (width - 1) + k])

Steps before the first read the ``width - 1`` values of ``initial_states`` (zeros without it). With
``cu_seqlens`` each packed sequence starts afresh: no output reads a step of another sequence.

On a GPU, widths 1 to 4 run on linrec's CUDA kernels (csrc/include/linrec/conv/): one read of x and one write of
the output, the backward one read of x and of the upstream gradient and one write of x's gradient. Elsewhere
(the CPU, wider kernels, torch.func transforms) the convolution runs as one ``torch.nn.functional.conv1d`` over
the sequences laid end to end, each preceded by its own ``width - 1`` starting values, with torch's derivatives.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ._core import causal_conv as kernels
from ._core.checks import (
    INDEX_DTYPES,
    REAL_DTYPES,
    as_bool,
    check_cache_row_values,
    check_device,
    check_dtype,
    check_tensor,
    packed_sequences,
)

__all__ = ["causal_conv1d", "causal_conv1d_update"]

#: The activations the convolution applies: none, or SiLU under either name.
ACTIVATIONS = (None, "silu", "swish")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    initial_states: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_final_states: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The causal depthwise convolution of each channel of ``x`` with its kernel, then the activation.

    Computed in float32 at least (16-bit ``x`` is read as float32, the output rounded to its dtype).
    Differentiable in ``x``, ``weight``, ``bias`` and ``initial_states``.

    Args:
        x: (batch, dim, length), float32, float64, float16 or bfloat16.
        weight: (dim, width), real: any width >= 1 (Mamba's are 2 to 4).
        bias: (dim,), real, or None.
        activation: None, or ``"silu"`` (``"swish"``): ``out * sigmoid(out)``.
        initial_states: the ``width - 1`` inputs before the first step, oldest first, (batch, dim, width - 1), or
            (sequences, dim, width - 1) with ``cu_seqlens``; None: zeros.
        cu_seqlens: packed variable-length sequences along the length, as ``linrec.linrec`` takes them: int32
            or int64 offsets ``[0, end_0, ..., length]`` (non-decreasing), with a batch of 1.
        return_final_states: also return the last ``width - 1`` inputs of every row (every sequence, with
            ``cu_seqlens``), oldest first, in ``x``'s dtype: the state ``causal_conv1d_update`` continues from.
            A sequence shorter than ``width - 1`` steps keeps the newest of its starting values in front.

    Returns:
        out, of ``x``'s shape and dtype; with ``return_final_states``, ``(out, final_states)``.

    Example:
        >>> x, weight = torch.randn(2, 8, 16), torch.randn(8, 4)
        >>> out = causal_conv1d(x, weight, activation="silu")
        >>> first, state = causal_conv1d(x[..., :10], weight, activation="silu", return_final_states=True)
        >>> rest = causal_conv1d(x[..., 10:], weight, activation="silu", initial_states=state)
        >>> torch.allclose(torch.cat([first, rest], -1), out, atol=1e-6)
        True
    """
    op = "linrec.causal_conv1d"
    return_final_states = as_bool(op, "return_final_states", return_final_states)
    _, dim, _, width = _check_conv(op, x, weight, bias, activation)
    rows = packed_sequences(op, cu_seqlens, "x", x)
    if initial_states is not None:
        check_tensor(op, "initial_states", initial_states)
        check_dtype(op, "initial_states", initial_states, REAL_DTYPES, "a real floating-point tensor")
        check_device(op, "initial_states", initial_states, "x", x.device)
        if list(initial_states.shape) != [rows, dim, width - 1]:
            what = "sequences (cu_seqlens' offsets - 1)" if cu_seqlens is not None else "batch"
            raise ValueError(f"{op}: initial_states must have shape ({what}, dim, width - 1) = {[rows, dim, width - 1]}, "
                             f"got {list(initial_states.shape)}")

    real_dtype = _compute_dtype(x, weight, bias, initial_states)
    if kernels.runs_on_kernels(x, width) and real_dtype == _compute_dtype(x):
        out, final = kernels.forward(x, weight, bias, activation is not None, initial_states, cu_seqlens,
                                     return_final_states, real_dtype)
    else:
        out, final = composed_causal_conv1d(x, weight, bias, activation, initial_states, cu_seqlens)
    return (out, final) if return_final_states else out


def composed_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                           initial_states: torch.Tensor | None,
                           cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """causal_conv1d's (out, final_states) from torch's ops (checked arguments): one conv1d over the sequences
    laid end to end, each preceded by its own width - 1 starting values; its derivatives are torch's."""
    dim, length = x.shape[1:]
    width = weight.shape[1]
    rows = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dtype = _compute_dtype(x, weight, bias, initial_states)
    starts = (x.new_zeros((rows, dim, width - 1), dtype=dtype) if initial_states is None
              else initial_states.to(dtype))
    values = x.to(dtype)
    if cu_seqlens is None and initial_states is None and length > 0 and dim > 0:
        # Zeros before the first step: conv1d's own padding, with no copy of x (its extra outputs dropped).
        out = _filter(values, weight, bias, activation, dtype, pad_before=True)
        # The last width - 1 inputs, zeros in front where there are fewer steps.
        tail = values[..., max(0, length - (width - 1)):]
        final = torch.cat([starts, tail], dim=-1)[..., tail.shape[-1]:]
    elif cu_seqlens is None:
        padded = torch.cat([starts, values], dim=-1)  # (batch, dim, width - 1 + length)
        out = _filter(padded, weight, bias, activation, dtype)
        final = padded[..., padded.shape[-1] - (width - 1):]
    else:
        # The sequences laid end to end, each after its own width - 1 starting values.
        offsets = cu_seqlens.to(torch.int64)
        steps = torch.arange(length, device=x.device)
        sequence_of_step = torch.searchsorted(offsets[1:], steps, right=True)
        step_slot = steps + (sequence_of_step + 1) * (width - 1)
        start_slot = (offsets[:-1] + torch.arange(rows, device=x.device) * (width - 1)).unsqueeze(1) \
            + torch.arange(width - 1, device=x.device)  # (sequences, width - 1)
        padded = values.new_zeros((dim, length + rows * (width - 1)))
        padded = padded.index_copy(1, step_slot, values[0]).index_copy(1, start_slot.flatten(),
                                                                     starts.permute(1, 0, 2).reshape(dim, -1))
        filtered = _filter(padded.unsqueeze(0), weight, bias, activation, dtype)[0]
        out = filtered.index_select(1, step_slot - (width - 1)).unsqueeze(0)
        end_slot = start_slot + (offsets[1:] - offsets[:-1]).unsqueeze(1)  # the width - 1 slots before each end
        final = padded.index_select(1, end_slot.flatten()).reshape(dim, rows, width - 1).permute(1, 0, 2)
    out = out.to(x.dtype)
    return out, final.to(x.dtype).contiguous()


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """The convolution's next steps for decoding, from ``conv_state``, which it updates in place.

    ``conv_state`` holds each row's last inputs, oldest first (``causal_conv1d``'s final states, or a longer
    buffer: its last ``width - 1`` are read). The new steps' outputs are those ``causal_conv1d`` gives for the
    steps after it, and ``conv_state`` ends holding the latest inputs, shifted by the number of steps.

    Args:
        x: the new steps, (batch, dim) for one step or (batch, dim, steps).
        conv_state: (batch, dim, state_len) with ``state_len >= width - 1``; with ``conv_state_indices`` a cache
            of rows (slots, dim, state_len). Of ``x``'s dtype or float32. Updated in place.
        weight: (dim, width).
        bias: (dim,), or None.
        activation: None, or ``"silu"`` (``"swish"``).
        conv_state_indices: int32 or int64 (batch,): the row of ``conv_state`` of each batch row (continuous
            batching), distinct; a negative index marks a padded batch row, whose output is computed from zeros
            and whose state is not written. None: batch row b takes row b. Eager calls check the values (one read
            on the host); under torch.compile or CUDA graph capture they are not read, and an index past the rows
            counts as padded.

    Returns:
        The outputs, of ``x``'s shape and dtype.

    Example:
        >>> x, weight = torch.randn(2, 8, 16), torch.randn(8, 4)
        >>> out, state = causal_conv1d(x[..., :15], weight, return_final_states=True)
        >>> step = causal_conv1d_update(x[..., 15], state, weight)
        >>> torch.allclose(step, causal_conv1d(x, weight)[..., 15], atol=1e-6)
        True
    """
    op = "linrec.causal_conv1d_update"
    check_tensor(op, "x", x)
    if x.dim() not in (2, 3):
        raise ValueError(f"{op}: x must be (batch, dim) or (batch, dim, steps), got shape {list(x.shape)}")
    one_step = x.dim() == 2
    steps_x = x.unsqueeze(-1) if one_step else x
    batch, dim, steps, width = _check_conv(op, steps_x, weight, bias, activation)
    check_tensor(op, "conv_state", conv_state)
    check_dtype(op, "conv_state", conv_state, REAL_DTYPES, "a real floating-point tensor")
    check_device(op, "conv_state", conv_state, "x", x.device)
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1 or (
            conv_state_indices is None and conv_state.shape[0] != batch):
        rows_text = "batch" if conv_state_indices is None else "slots"
        raise ValueError(f"{op}: conv_state must be ({rows_text}, dim, state_len) with dim = {dim} and state_len >= "
                         f"width - 1 = {width - 1}" + (f", batch = {batch}" if conv_state_indices is None else "")
                         + f", got shape {list(conv_state.shape)}")
    if conv_state_indices is not None:
        check_tensor(op, "conv_state_indices", conv_state_indices)
        check_dtype(op, "conv_state_indices", conv_state_indices, INDEX_DTYPES)
        check_device(op, "conv_state_indices", conv_state_indices, "x", x.device)
        if list(conv_state_indices.shape) != [batch]:
            raise ValueError(f"{op}: conv_state_indices must have shape (batch,) = [{batch}], got "
                             f"{list(conv_state_indices.shape)}")
        check_cache_row_values(op, "conv_state_indices", conv_state_indices, "conv_state", conv_state.shape[0])

    dtype = _compute_dtype(x, weight, bias, conv_state)
    if (kernels.runs_on_kernels(x, width) and dtype == _compute_dtype(x) and conv_state.is_contiguous()
            and conv_state.dtype in (x.dtype, torch.float32) and not _records_gradient(x, weight, bias)):
        out = kernels.update(conv_state, steps_x, weight, bias, activation is not None, conv_state_indices, dtype)
        return out.squeeze(-1) if one_step else out
    state_len = conv_state.shape[2]
    if conv_state_indices is None:
        history = conv_state
    else:
        indices = conv_state_indices.to(torch.int64)
        # Past the rows counts as padded too: torch.compile does not check the values (eager calls raise above).
        padded_row = (indices < 0) | (indices >= conv_state.shape[0])
        indices = torch.where(padded_row, 0, indices)
        history = conv_state.index_select(0, indices) if conv_state.shape[0] else conv_state.new_zeros(
            (batch, dim, state_len))
        history = history.masked_fill(padded_row.view(-1, 1, 1), 0)
    window = torch.cat([history.to(dtype), steps_x.to(dtype)], dim=-1)  # (batch, dim, state_len + steps)
    out = _filter(window[..., state_len - (width - 1):], weight, bias, activation, dtype).to(x.dtype)
    latest = window[..., steps:].to(conv_state.dtype)  # (batch, dim, state_len)
    if conv_state_indices is None:
        conv_state.copy_(latest)
    elif conv_state.shape[0]:
        conv_state.index_copy_(0, *_written_rows(conv_state, indices, padded_row, latest))
    return out.squeeze(-1) if one_step else out


def _written_rows(conv_state: torch.Tensor, indices: torch.Tensor, padded_row: torch.Tensor,
                  latest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of conv_state to write and what to write there, one per batch row (``indices``: padded rows' 0),
    with no shape that depends on the indices' values (no host synchronization, and torch.compile traces it
    whole): a padded batch row writes what the first unpadded one writes, to the same row, or, where every
    batch row is padded, row 0's own content back."""
    first = torch.argmax((~padded_row).to(torch.int8)).view(1)  # the first unpadded batch row, or 0 where none is
    target = torch.where(padded_row, indices.index_select(0, first), indices)
    unchanged = conv_state.index_select(0, target)
    instead = torch.where(padded_row.index_select(0, first).view(1, 1, 1), unchanged, latest.index_select(0, first))
    return target, torch.where(padded_row.view(-1, 1, 1), instead, latest)


def _records_gradient(*tensors: torch.Tensor | None) -> bool:
    """Whether a call records a graph: the decode step's kernel has no derivatives, the composed step has torch's."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_conv(op: str, x, weight, bias, activation) -> tuple[int, int, int, int]:
    """Checks x (3-dim), weight, bias and activation; returns (batch, dim, length, width)."""
    check_tensor(op, "x", x)
    check_dtype(op, "x", x, REAL_DTYPES, "a real floating-point tensor")
    if x.dim() != 3:
        raise ValueError(f"{op}: x must be (batch, dim, length), got shape {list(x.shape)}")
    batch, dim, length = x.shape
    check_tensor(op, "weight", weight)
    check_dtype(op, "weight", weight, REAL_DTYPES, "a real floating-point tensor")
    check_device(op, "weight", weight, "x", x.device)
    if weight.dim() != 2 or weight.shape[0] != dim or weight.shape[1] < 1:
        raise ValueError(f"{op}: weight must be (dim, width) with dim = {dim} (x's dim 1) and width >= 1, got shape "
                         f"{list(weight.shape)}")
    if bias is not None:
        check_tensor(op, "bias", bias)
        check_dtype(op, "bias", bias, REAL_DTYPES, "a real floating-point tensor")
        check_device(op, "bias", bias, "x", x.device)
        if list(bias.shape) != [dim]:
            raise ValueError(f"{op}: bias must have shape (dim,) = [{dim}], got {list(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'silu' or 'swish', got {activation!r}")
    return batch, dim, length, weight.shape[1]


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32, or float64 where any argument is."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _filter(padded: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
            dtype: torch.dtype, pad_before: bool = False) -> torch.Tensor:
    """The valid depthwise convolution of ``padded`` (rows, dim, width - 1 + steps) with ``weight``: (rows, dim,
    steps), the bias added and the activation applied, in ``dtype`` (under autocast too). ``pad_before``:
    ``padded`` is (rows, dim, steps), with steps >= 1 and dim >= 1, and zeros stand before it."""
    dim, width = weight.shape
    weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
    device_type = padded.device.type
    # Meta tensors have no autocast; Dynamo cannot trace the availability query, so it is asked only elsewhere.
    has_autocast = device_type in ("cpu", "cuda") or (
        not torch.compiler.is_compiling() and torch.amp.is_autocast_available(device_type))
    no_autocast = torch.autocast(device_type, enabled=False) if has_autocast else contextlib.nullcontext()
    with no_autocast:
        if pad_before:  # conv1d pads both ends: the outputs past the last step are dropped
            out = F.conv1d(padded, weight.unsqueeze(1), bias, padding=width - 1, groups=dim)[..., :padded.shape[-1]]
        elif dim == 0 or padded.shape[-1] < width:  # nothing to filter, which conv1d refuses
            out = padded[..., width - 1:] * weight[:, -1:]
            out = out if bias is None else out + bias.unsqueeze(-1)
        else:
            out = F.conv1d(padded, weight.unsqueeze(1), bias, groups=dim)
        return F.silu(out) if activation is not None else out
