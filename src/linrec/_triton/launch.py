"""Host side of the Triton backend: the implementations of ``linrec::triton_forward`` and
``linrec::triton_backward``. Each maps its operands onto the kernels' four-dim view (layout.py),
picks a tile (configs.py) and launches one kernel. Arguments arrive checked by the API or the fake
kernels' checks; what is checked here is what only the Triton backend needs."""

from __future__ import annotations

import contextlib
from functools import cache

import torch
import triton
import triton.language as tl

from . import configs
from .kernels import linrec_backward_kernel, linrec_forward_kernel
from .layout import Layout, plan

_ACCUMULATORS = {torch.float64: tl.float64}  # every other dtype accumulates in float32
#: Offsets that can pass 2^31 - 1 elements are computed in 64 bits.
_INT32_ELEMENTS = 2**31 - 1


def interpreted() -> bool:
    """Whether the kernels run on Triton's interpreter (TRITON_INTERPRET=1 when they were first imported):
    then they take CPU tensors, on the host."""
    return type(linrec_forward_kernel).__name__ == "InterpretedFunction"


def _check_device(op: str, tensor: torch.Tensor) -> None:
    if tensor.is_cuda or (tensor.is_cpu and interpreted()):
        return
    if tensor.is_cpu:
        raise RuntimeError(
            f"{op}: backend='triton' runs CPU tensors only on Triton's interpreter: set TRITON_INTERPRET=1 before "
            "the first call (the kernels were compiled for a GPU), or use backend='auto' on the CPU"
        )
    raise RuntimeError(f"{op}: backend='triton' runs on GPU tensors (CUDA or ROCm), got {tensor.device}")


def _check_dtype(op: str, tensor: torch.Tensor) -> None:
    if tensor.is_complex():
        raise TypeError(
            f"{op}: backend='triton' takes float32, float64, float16 or bfloat16, got {tensor.dtype}; "
            "complex recurrences run on backend='auto'"
        )


@cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _device_guard(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    # Triton launches on the current device.
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def _initial_strides(initial: torch.Tensor | None, dim: int, packed: bool) -> tuple[tuple[int, ...], int]:
    """initial's strides in the inputs' dims (0 along time; with packing, 0 along the batch dim of size 1,
    whose index is the sequence's instead), and its stride between sequences."""
    if initial is None:
        return (), 0
    strides = list(initial.stride())
    strides.insert(dim, 0)
    if packed:
        sequence_stride, strides[0] = strides[0], 0
        return tuple(strides), sequence_stride
    return tuple(strides), 0


def _sequence_index(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """The packed sequence of every time position (int32)."""
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return (torch.searchsorted(cu_seqlens, positions, right=True) - 1).to(torch.int32)


def _config(layout: Layout, time_stride: int, device: torch.device, block_length: int, block_channels: int):
    if block_length or block_channels:
        return configs.forced(block_length or configs.MIN_BLOCK_L, block_channels or 1)
    return configs.choose(layout, time_stride == 1 or layout.length == 1, _multiprocessors(device))


def _launch_common(layout: Layout, config: configs.TileConfig, dtype: torch.dtype, extent: int):
    """The grid, and the launch arguments every kernel takes the same way."""
    channel_blocks = triton.cdiv(layout.channels, config.block_channels)
    grid = (layout.batch0 * layout.batch1 * channel_blocks,)
    sizes = (layout.length, layout.channels, layout.batch1, channel_blocks)
    accumulator = _ACCUMULATORS.get(dtype, tl.float32)
    return grid, sizes, accumulator, extent > _INT32_ELEMENTS


def _extent(*tensors: torch.Tensor | None) -> int:
    """The largest element offset any operand reaches."""
    return max((sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1)
               for t in tensors if t is not None and t.numel())


def _packing(cu_seqlens: torch.Tensor | None, length: int, like: torch.Tensor):
    """The kernels' cu_seqlens and sequence-index pointers (unused placeholders without packing)."""
    if cu_seqlens is None:
        return like, like
    return cu_seqlens, _sequence_index(cu_seqlens, length)


def _planned(shape: torch.Size, dim: int, tensors: list[torch.Tensor], roles: str,
             initial_strides: tuple[int, ...]) -> tuple[Layout, list[torch.Tensor]]:
    """The layout of `tensors` with initial's strides last. `roles` has a letter per tensor: r (read),
    w (written) or k (kept: a stride-0 sum buffer, which merges with any dense layout). Where the strides
    do not merge, the layout of contiguous copies of the read ones and fresh buffers for the written ones,
    which ``_copy_back`` copies to the tensors."""
    extra = [initial_strides] if initial_strides else []
    layout = plan(shape, dim, [t.stride() for t in tensors] + extra)
    if layout is not None:
        return layout, tensors
    dense = [t.contiguous() if role == "r" else
             torch.empty(t.shape, dtype=t.dtype, device=t.device) if role == "w" and not t.is_contiguous() else t
             for t, role in zip(tensors, roles)]
    return plan(shape, dim, [t.stride() for t in dense] + extra), dense


def _copy_back(planned: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
    for buffer, tensor in zip(planned, tensors):
        if buffer is not tensor:
            tensor.copy_(buffer)


def _initial_args(layout: Layout, initial: torch.Tensor | None, initial_sequence: int) -> tuple[int, ...]:
    """initial's (batch0, batch1, channels) strides and its stride between packed sequences."""
    if initial is None:
        return 0, 0, 0, 0
    batch0, batch1, _, channels = layout.strides[-1]
    return batch0, batch1, channels, initial_sequence


def _coeffs_vary_in_time(coeffs: torch.Tensor, shape: torch.Size, dim: int) -> bool:
    time_dim = dim - (len(shape) - coeffs.dim())  # coeffs broadcast from the right
    return time_dim >= 0 and coeffs.shape[time_dim] != 1


def forward(inputs: torch.Tensor, coeffs: torch.Tensor, dim: int = -1, reverse: bool = False,
            initial: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None, log_coeffs: bool = False,
            block_length: int = 0, block_channels: int = 0) -> torch.Tensor:
    op = "linrec.triton_forward"
    _check_device(op, inputs)
    _check_dtype(op, inputs)
    dim %= inputs.dim()
    outputs = torch.empty_like(inputs)
    if inputs.numel() == 0:
        return outputs
    packed = cu_seqlens is not None
    initial = initial.contiguous() if initial is not None else None
    initial_strides, initial_sequence = _initial_strides(initial, dim, packed)
    tensors = [inputs, coeffs.expand(inputs.shape), outputs]
    layout, planned = _planned(inputs.shape, dim, tensors, "rrw", initial_strides)
    config = _config(layout, layout.strides[0][2], inputs.device, block_length, block_channels)
    grid, sizes, accumulator, index_64 = _launch_common(layout, config, inputs.dtype, _extent(*planned))
    cu_seqlens_arg, sequence = _packing(cu_seqlens, layout.length, inputs)
    with _device_guard(inputs):
        linrec_forward_kernel[grid](
            *planned, initial if initial is not None else inputs, cu_seqlens_arg, sequence, *sizes,
            *layout.strides[0], *layout.strides[1], *layout.strides[2],
            *_initial_args(layout, initial, initial_sequence),
            REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed, LOG_COEFFS=log_coeffs,
            ACC=accumulator, INDEX_64=index_64, BLOCK_L=config.block_length, BLOCK_C=config.block_channels,
            num_warps=config.warps,
        )
    _copy_back(planned, tensors)
    return outputs


def backward(d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, dim: int = -1,
             reverse: bool = False, initial: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
             log_coeffs: bool = False, block_length: int = 0, block_channels: int = 0,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "linrec.triton_backward"
    _check_device(op, d_outputs)
    _check_dtype(op, d_outputs)
    dim %= d_outputs.dim()
    shape = d_outputs.shape
    packed = cu_seqlens is not None
    full_coeffs = coeffs.shape == shape
    d_inputs = torch.empty_like(outputs)
    d_coeffs = torch.empty_like(outputs) if full_coeffs else coeffs.new_empty(coeffs.shape)
    if initial is None:
        d_initial = d_outputs.new_zeros((0,))
    else:
        initial = initial.contiguous()
        d_initial = torch.zeros_like(initial) if packed else torch.empty_like(initial)
    if d_outputs.numel() == 0:
        return d_inputs, d_coeffs.zero_(), d_initial.zero_()
    # Broadcast coeffs: the kernel sums d_coeffs over time where coeffs do not vary along it, else writes one
    # value per element in the accumulator type; torch sums over the other dims they broadcast along.
    accumulator_dtype = torch.float64 if d_outputs.dtype == torch.float64 else torch.float32
    sum_over_time = not full_coeffs and not _coeffs_vary_in_time(coeffs, shape, dim)
    if full_coeffs:
        d_coeffs_buffer = d_coeffs
    elif sum_over_time:
        d_coeffs_buffer = torch.empty_like(outputs.narrow(dim, 0, 1), dtype=accumulator_dtype).expand(shape)
    else:
        d_coeffs_buffer = torch.empty_like(outputs, dtype=accumulator_dtype)
    initial_strides, initial_sequence = _initial_strides(initial, dim, packed)
    tensors = [d_outputs, coeffs.expand(shape), outputs, d_inputs, d_coeffs_buffer]
    layout, planned = _planned(shape, dim, tensors, "rrrwk" if sum_over_time else "rrrww", initial_strides)
    config = _config(layout, layout.strides[0][2], d_outputs.device, block_length, block_channels)
    grid, sizes, accumulator, index_64 = _launch_common(layout, config, d_outputs.dtype, _extent(*planned))
    cu_seqlens_arg, sequence = _packing(cu_seqlens, layout.length, d_outputs)
    placeholder = d_outputs  # a pointer for the arguments a specialization does not read
    with _device_guard(d_outputs):
        linrec_backward_kernel[grid](
            *planned[:3], initial if initial is not None else placeholder, cu_seqlens_arg, sequence, *planned[3:],
            d_initial if initial is not None else placeholder, *sizes,
            *layout.strides[0], *layout.strides[1], *layout.strides[2],
            *_initial_args(layout, initial, initial_sequence), *layout.strides[3], *layout.strides[4],
            REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed, LOG_COEFFS=log_coeffs,
            SUM_COEFFS_OVER_TIME=sum_over_time, ACC=accumulator, INDEX_64=index_64,
            BLOCK_L=config.block_length, BLOCK_C=config.block_channels, num_warps=config.warps,
        )
    _copy_back(planned, tensors)
    if d_coeffs_buffer is not d_coeffs:
        per_element = d_coeffs_buffer.narrow(dim, 0, 1) if sum_over_time else d_coeffs_buffer
        d_coeffs.copy_(per_element.sum_to_size(coeffs.shape))
    return d_inputs, d_coeffs, d_initial
