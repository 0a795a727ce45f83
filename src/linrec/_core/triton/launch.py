"""Host side of the Triton backend: the implementations of ``linrec::triton_forward`` and
``linrec::triton_backward``. Each maps its operands onto the kernels' four-dim view (layout.py),
picks a tile (configs.py) and launches one kernel, which also rescans the sequences whose results are
not finite: no other launch, allocation or host synchronization than the results' own. Few long rows
split into segments take three launches (the segments' maps, their scan, the segments from the states
entering them) and a rescan kernel, whose programs return at once where no column is flagged, and three
allocations (the maps, the states, the flags). Each op checks its arguments as the fake kernels do
(checks.py), and what only the Triton backend needs.

Mixed precision (float32 coeffs or initial with 16-bit inputs) converts nothing: the kernels read every
operand through its own pointer into the accumulator type (float32 for 16-bit inputs) and store each
gradient in its buffer's dtype, which is allocated here in its argument's. The tile and the compensated
products follow the inputs' dtype."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cache, lru_cache

import torch
import triton.language as tl

from ..checks import check_arguments, check_backward_arguments, check_cu_seqlens_values
from . import check_dtype, configs
from .kernels import (linrec_backward_kernel, linrec_forward_kernel, linrec_rescan_backward_kernel,
                      linrec_rescan_forward_kernel)
from .layout import Layout, plan

_ACCUMULATORS = {torch.float64: tl.float64}  # every other dtype accumulates in float32
#: Offsets that can pass 2^31 - 1 elements are computed in 64 bits.
_INT32_ELEMENTS = 2**31 - 1


def interpreted() -> bool:
    """Whether the kernels run on Triton's interpreter (TRITON_INTERPRET=1 when they were first imported):
    then they take CPU tensors, on the host."""
    return type(linrec_forward_kernel).__name__ == "InterpretedFunction"


def _check_offsets(op: str, cu_seqlens: torch.Tensor | None, length: int) -> None:
    """The values of offsets on the CPU, as the compiled ops check them; on a GPU, ``linrec.linrec`` checks
    them once per tensor and the kernels clamp them."""
    if cu_seqlens is not None and cu_seqlens.is_cpu:
        check_cu_seqlens_values(op, cu_seqlens, length)


def _check_device(op: str, tensor: torch.Tensor) -> None:
    if tensor.is_cuda or (tensor.is_cpu and interpreted()):
        return
    if tensor.is_cpu:
        raise RuntimeError(
            f"{op}: backend='triton' runs CPU tensors only on Triton's interpreter: set TRITON_INTERPRET=1 before "
            "the first call (the kernels were compiled for a GPU), or use backend='auto' on the CPU"
        )
    raise RuntimeError(f"{op}: backend='triton' runs on GPU tensors (CUDA or ROCm), got {tensor.device}")


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


@dataclass(frozen=True)
class _Plan:
    """How one call runs: the layout, the tile, and the time steps each program scans (a segment of
    ``segment_length``, or the whole length)."""

    layout: Layout
    config: configs.TileConfig
    segment_length: int
    accumulator_dtype: torch.dtype
    index_64: bool
    compensated: bool  # whether the scans carry their products' rounding errors (float32: kernels.py)
    maps: _Plan | None = None  # a split call's scan over its segments' maps

    # Plain integer arithmetic: triton.cdiv is a jit function, whose call from Python costs microseconds.
    @property
    def rows(self) -> int:
        return self.layout.batch0 * self.layout.batch1

    @property
    def segments(self) -> int:
        return -(-self.layout.length // self.segment_length)

    @property
    def channel_blocks(self) -> int:
        return -(-self.layout.channels // self.config.block_channels)

    def grid(self) -> tuple[int]:
        return (self.segments * self.rows * self.channel_blocks,)

    def sizes(self) -> tuple[int, ...]:
        """The kernels' size arguments: length, channels, rows, batch1, channel_blocks, segment_length."""
        layout = self.layout
        return layout.length, layout.channels, self.rows, layout.batch1, self.channel_blocks, self.segment_length

    def rescan_grid(self) -> tuple[int]:
        return (self.rows * self.channel_blocks,)

    def rescan_sizes(self, sequences: int) -> tuple[int, ...]:
        """The rescan kernels' size arguments: length, channels, batch1, channel_blocks, sequences."""
        layout = self.layout
        return layout.length, layout.channels, layout.batch1, self.channel_blocks, sequences

    def flags(self, device: torch.device) -> torch.Tensor:
        """The (rows, channels) flags of a split call, which its aggregate pass clears, its CARRY_IN pass
        sets where a result is not finite, and the rescan kernels read."""
        return torch.empty((self.rows, self.layout.channels), dtype=torch.int32, device=device)

    def rescan_constants(self) -> dict:
        return dict(ACC=_ACCUMULATORS.get(self.accumulator_dtype, tl.float32), BLOCK_C=self.config.block_channels,
                    num_warps=1)

    def constants(self) -> dict:
        return dict(ACC=_ACCUMULATORS.get(self.accumulator_dtype, tl.float32), INDEX_64=self.index_64,
                    COMPENSATED=self.compensated, BLOCK_L=self.config.block_length,
                    BLOCK_C=self.config.block_channels, num_warps=self.config.warps)


def _chosen(layout: Layout, dtype: torch.dtype, multiprocessors: int) -> configs.TileConfig:
    time_contiguous = layout.strides[0][2] == 1 or layout.length == 1
    return configs.choose(layout, time_contiguous, dtype.itemsize, multiprocessors, dtype == torch.float32)


def _maps_plan(layout: Layout, segments: int, multiprocessors: int) -> _Plan:
    """The plan of the scan over a split call's segment maps: contiguous float64 (segments, rows, channels)
    buffers with the call's batch and channel dims, each row and channel block scanned over all its
    segments by one program."""
    batch1_stride, rows = layout.channels * layout.batch1, layout.batch0 * layout.batch1
    maps = (batch1_stride, layout.channels, rows * layout.channels, 1)
    maps_layout = Layout(layout.batch0, layout.batch1, segments, layout.channels, (maps,))
    return _Plan(maps_layout, _chosen(maps_layout, torch.float64, multiprocessors), segments, torch.float64,
                 maps_layout.extent() > _INT32_ELEMENTS, False)


@lru_cache(maxsize=4096)
def _plan(layout: Layout, dtype: torch.dtype, device: torch.device, block_length: int, block_channels: int) -> _Plan:
    multiprocessors = _multiprocessors(device)
    if block_length or block_channels:
        config = configs.forced(block_length or configs.MIN_BLOCK_L, block_channels or 1)
    else:
        config = _chosen(layout, dtype, multiprocessors)
    accumulator_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    segment_length = configs.segment_length(layout, config, multiprocessors)
    segments = -(-layout.length // segment_length)
    return _Plan(layout, config, segment_length, accumulator_dtype, layout.extent() > _INT32_ELEMENTS,
                 dtype == torch.float32, _maps_plan(layout, segments, multiprocessors) if segments > 1 else None)


def _segment_states(plan: _Plan, aggregate, scan_reverse: bool, initial: torch.Tensor | None,
                    initial_args: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The state leaving each segment of a split call, as a contiguous (segments, rows, channels) float64
    buffer, from which the kernels' CARRY_IN pass reads the state entering each segment: ``aggregate(states,
    products)`` stores each segment's composed map (its state from a zero carry, and the product of its
    coefficients), and the forward kernel scans the maps over the segments in the direction of the kernel's
    scan, from ``initial`` (unpacked, given by ``initial_args``, the call's initial strides) or zero. The maps
    are float64, so that the products (which the kernels store with their rounding error) compose without
    compounding it."""
    maps = plan.maps
    states, products = torch.empty((2, plan.segments, plan.rows, plan.layout.channels), dtype=torch.float64,
                                   device=device)
    aggregate(states, products)
    leaving = torch.empty_like(states)
    linrec_forward_kernel[maps.grid()](
        states, products, leaving, initial if initial is not None else states, states, states, states, states, states,
        *maps.sizes(), 1, *maps.layout.strides[0], *maps.layout.strides[0], *maps.layout.strides[0], *initial_args,
        REVERSE=scan_reverse, HAS_INITIAL=initial is not None, PACKED=False, LOG_COEFFS=False, AGGREGATE=False,
        CARRY_IN=False, **maps.constants(),
    )
    return leaving


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
    extra = (initial_strides,) if initial_strides else ()
    layout = plan(tuple(shape), dim, tuple(t.stride() for t in tensors) + extra)
    if layout is not None:
        return layout, tensors
    dense = [t.contiguous() if role == "r" else
             torch.empty(t.shape, dtype=t.dtype, device=t.device) if role == "w" and not t.is_contiguous() else t
             for t, role in zip(tensors, roles)]
    return plan(tuple(shape), dim, tuple(t.stride() for t in dense) + extra), dense


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


def _rescans(flags: torch.Tensor) -> bool:
    """Whether to launch a split call's rescan kernel: on a GPU always (its programs return at once where
    nothing is flagged, and reading the flags would wait for the GPU); on the interpreter only where a flag
    is set, since each of its programs costs host time there."""
    return not interpreted() or bool(flags.any())


def _coeffs_vary_in_time(coeffs: torch.Tensor, shape: torch.Size, dim: int) -> bool:
    time_dim = dim - (len(shape) - coeffs.dim())  # coeffs broadcast from the right
    return time_dim >= 0 and coeffs.shape[time_dim] != 1


def forward(inputs: torch.Tensor, coeffs: torch.Tensor, dim: int = -1, reverse: bool = False,
            initial: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None, log_coeffs: bool = False,
            block_length: int = 0, block_channels: int = 0) -> torch.Tensor:
    op = "linrec.triton_forward"
    dim = check_arguments(op, inputs, coeffs, dim, initial, cu_seqlens, log_coeffs)
    _check_device(op, inputs)
    check_dtype(op, inputs.dtype)
    _check_offsets(op, cu_seqlens, inputs.shape[dim])
    outputs = torch.empty_like(inputs)
    if inputs.numel() == 0:
        return outputs
    packed = cu_seqlens is not None
    initial = initial.contiguous() if initial is not None else None
    initial_strides, initial_sequence = _initial_strides(initial, dim, packed)
    tensors = [inputs, coeffs.expand(inputs.shape), outputs]
    layout, planned = _planned(inputs.shape, dim, tensors, "rrw", initial_strides)
    plan = _plan(layout, inputs.dtype, inputs.device, block_length, block_channels)
    cu_seqlens_arg, sequence = _packing(cu_seqlens, layout.length, inputs)
    placeholder = inputs  # a pointer for the arguments a specialization does not read
    sequences = 1 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    initial_args = _initial_args(layout, initial, initial_sequence)

    def run(carries=placeholder, products=placeholder, flags=placeholder, aggregate=False, carry_in=False):
        linrec_forward_kernel[plan.grid()](
            *planned, initial if initial is not None else placeholder, cu_seqlens_arg, sequence, carries, products,
            flags, *plan.sizes(), sequences, *layout.strides[0], *layout.strides[1], *layout.strides[2], *initial_args,
            REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed, LOG_COEFFS=log_coeffs,
            AGGREGATE=aggregate, CARRY_IN=carry_in, **plan.constants(),
        )

    with _device_guard(inputs):
        if plan.segments == 1:
            run()
        else:
            unpacked_initial = initial if initial is not None and not packed else None
            flags = plan.flags(inputs.device)
            carries = _segment_states(plan, lambda states, products: run(states, products, flags, aggregate=True),
                                      reverse, unpacked_initial, initial_args, inputs.device)
            run(carries, flags=flags, carry_in=True)
            if _rescans(flags):
                linrec_rescan_forward_kernel[plan.rescan_grid()](
                    *planned, initial if initial is not None else placeholder, cu_seqlens_arg, flags,
                    *plan.rescan_sizes(sequences), *layout.strides[0], *layout.strides[1], *layout.strides[2],
                    *initial_args, REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed,
                    LOG_COEFFS=log_coeffs, **plan.rescan_constants(),
                )
    _copy_back(planned, tensors)
    return outputs


def backward(d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, dim: int = -1,
             reverse: bool = False, initial: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
             log_coeffs: bool = False, block_length: int = 0, block_channels: int = 0,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "linrec.triton_backward"
    dim = check_backward_arguments(op, d_outputs, coeffs, outputs, dim, initial, cu_seqlens, log_coeffs)
    _check_device(op, d_outputs)
    check_dtype(op, d_outputs.dtype)
    _check_offsets(op, cu_seqlens, d_outputs.shape[dim])
    shape = d_outputs.shape
    packed = cu_seqlens is not None
    full_coeffs = coeffs.shape == shape
    d_inputs = torch.empty_like(outputs)
    d_coeffs = torch.empty_like(outputs, dtype=coeffs.dtype) if full_coeffs else coeffs.new_empty(coeffs.shape)
    if initial is None:
        d_initial = d_outputs.new_zeros((0,))
    else:
        initial = initial.contiguous()
        d_initial = torch.zeros_like(initial) if packed else torch.empty_like(initial)
    if d_outputs.numel() == 0:
        return d_inputs, d_coeffs.zero_(), d_initial.zero_()
    # Broadcast coeffs: the kernel sums d_coeffs over time where coeffs do not vary along it (one sum per
    # segment), else writes one value per element in the accumulator type; torch sums what remains.
    accumulator_dtype = torch.float64 if d_outputs.dtype == torch.float64 else torch.float32
    sum_over_time = not full_coeffs and not _coeffs_vary_in_time(coeffs, shape, dim)
    expanded_coeffs = coeffs.expand(shape)
    initial_strides, initial_sequence = _initial_strides(initial, dim, packed)
    # The layout and the plan do not depend on d_coeffs' buffer, which needs the number of segments.
    probe = [d_outputs, expanded_coeffs, outputs, d_inputs]
    layout, _ = _planned(shape, dim, probe, "rrrw", initial_strides)
    plan = _plan(layout, d_outputs.dtype, d_outputs.device, block_length, block_channels)
    if full_coeffs:
        d_coeffs_buffer = sums = d_coeffs
    elif sum_over_time:
        sums = outputs.new_empty((plan.segments, *outputs.narrow(dim, 0, 1).shape), dtype=accumulator_dtype)
        d_coeffs_buffer = sums[0].expand(shape)
    else:
        d_coeffs_buffer = sums = torch.empty_like(outputs, dtype=accumulator_dtype)
    tensors = [*probe, d_coeffs_buffer]
    layout, planned = _planned(shape, dim, tensors, "rrrwk" if sum_over_time else "rrrww", initial_strides)
    cu_seqlens_arg, sequence = _packing(cu_seqlens, layout.length, d_outputs)
    placeholder = d_outputs  # a pointer for the arguments a specialization does not read
    sequences = 1 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    initial_args = _initial_args(layout, initial, initial_sequence)

    def run(carries=placeholder, products=placeholder, flags=placeholder, aggregate=False, carry_in=False):
        linrec_backward_kernel[plan.grid()](
            *planned[:3], initial if initial is not None else placeholder, cu_seqlens_arg, sequence, *planned[3:],
            d_initial if initial is not None else placeholder, carries, products, flags,
            *plan.sizes(), sequences, sums.stride(0) if sum_over_time else 0,
            *layout.strides[0], *layout.strides[1], *layout.strides[2], *initial_args,
            *layout.strides[3], *layout.strides[4],
            REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed, LOG_COEFFS=log_coeffs,
            SUM_COEFFS_OVER_TIME=sum_over_time, AGGREGATE=aggregate, CARRY_IN=carry_in, **plan.constants(),
        )

    with _device_guard(d_outputs):
        if plan.segments == 1:
            run()
        else:
            flags = plan.flags(d_outputs.device)
            carries = _segment_states(plan, lambda states, products: run(states, products, flags, aggregate=True),
                                      not reverse, None, (0, 0, 0, 0), d_outputs.device)
            run(carries, flags=flags, carry_in=True)
            if _rescans(flags):
                linrec_rescan_backward_kernel[plan.rescan_grid()](
                    *planned[:3], initial if initial is not None else placeholder, cu_seqlens_arg, *planned[3:],
                    d_initial if initial is not None else placeholder, flags, *plan.rescan_sizes(sequences),
                    *layout.strides[0], *layout.strides[1], *layout.strides[2], *initial_args,
                    *layout.strides[3], *layout.strides[4],
                    REVERSE=reverse, HAS_INITIAL=initial is not None, PACKED=packed, LOG_COEFFS=log_coeffs,
                    STORE_COEFFS=not sum_over_time, **plan.rescan_constants(),
                )
    _copy_back(planned, tensors)
    if sums is not d_coeffs:
        per_element = sums.sum(0) if sum_over_time else sums  # summed over segments
        d_coeffs.copy_(per_element.sum_to_size(coeffs.shape))
    return d_inputs, d_coeffs, d_initial
