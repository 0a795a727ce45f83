"""The Triton scans: one forward kernel and one fused backward kernel, each a pipe over time chunks.

Every operand is addressed as a strided (batch0, batch1, time, channels) view (layout.py maps any
call onto it). A program owns one (batch0, batch1) row and a block of ``BLOCK_C`` channels, and walks
the time dim in chunks of ``BLOCK_L`` steps: a chunk is scanned as one tile with
``tl.associative_scan`` over (coefficient, input) pairs, and the state after it is the carry that
enters the next chunk. With one chunk this is the tile scan; with several, the pipe.

Chunks always hold ascending time positions, so their loads vectorize; ``reverse`` runs the chunks
from last to first and scans each tile in reverse. The backward kernel is the same scan run the other
way (``d_inputs[l] = d_outputs[l] + coeffs[next(l)] * d_inputs[next(l)]``) with the coefficients
loaded one step shifted, and forms ``d_coeffs`` and ``d_initial`` from ``d_inputs`` in the same pass.

A sequence's first step (position 0, the last with ``reverse``, or a ``cu_seqlens`` offset) takes
``initial``, or nothing: its coefficient is then set to zero, so the carry from the chunk or sequence
before it has no effect (and an infinite or NaN first coefficient none either). A coefficient of exactly
0 drops the state it would multiply, so that an infinite or NaN state does not cross a reset.

float32 (COMPENSATED) scans each tile over (coefficient, value, error) triples: every product of
coefficients carries its rounding error, the tree's levels included. A tree multiplies equal partial
products where one decay repeats, so a plain product of a tile's n coefficients is off by about n
roundings of the same sign, not sqrt(n) as the sequential loop's (with decays 0.999 and 2048-step tiles,
4x the float32 loop's error on the outputs); the carry from chunk to chunk and the maps of split rows
would compound that further (docs/design.md, Accuracy of products of coefficients). float64 keeps 53
bits and 16-bit outputs round far above the error: they scan plain products.

Non-finite results (IEEE semantics, docs/design.md): the reduction that takes a chunk's last result as
the carry also sums ``result * 0`` per column (0, or NaN where a result is not finite). A program that
scans whole rows then rescans, by the sequential loop, the sequences of its flagged columns whose
results hold a non-finite value, after its own stores; where every result is finite nothing more runs.
The programs of a split row set a (rows, channels) flag word with an atomic where a column holds a
non-finite result, after the aggregate pass cleared it, and the rescan kernels read it.

Few long rows split the time dim into segments of ``segment_length``, one program each, in three
launches (launch.py): the kernel with ``AGGREGATE`` stores each segment's composed map instead of
outputs (the product of its coefficients, with its rounding error, in float64, and its state from a
zero carry, into ``products`` and ``carries``), the forward kernel scans those maps over the segments
in float64 into the state leaving each segment, and the kernel with ``CARRY_IN`` scans each segment
from the state leaving the segment before it (``initial`` or zero for the first). Segment, row and
channel block are one program id; a call that is not split has one segment.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _compose_compensated(coeff_earlier, input_earlier, error_earlier, coeff_later, input_later, error_later):
    """The composition of two maps y -> (c + e) y + x, each coefficient known as c + e (a product of
    coefficients and its rounding error), earlier one first: the product of the coefficients, with its
    error, and ``(c_later + e_later) * x_earlier + x_later``.

    The product's error is the two-product's rounding by a fused multiply-add plus the first-order terms
    (0 where the product is 0). Carried in float32 (COMPENSATED) so that a decay near 1 repeated along a
    row does not compound one rounding from step to step of the tree and from chunk to chunk (as in the
    CUDA kernels: csrc/include/linrec/block_scan.h, numeric.h); 16-bit outputs round far above that error.
    A later coefficient of exactly 0 (a sequence's start) drops the earlier input rather than multiplying
    it, so that an infinite or NaN state does not cross a reset.

    The formulas are written here rather than in helpers: Triton's interpreter calls a scan's combine
    function once per element, and each call of a nested ``triton.jit`` function (``tl.zeros_like``
    is one) costs it about a millisecond. ``_advance`` and ``_times`` take their parts (the compiler
    drops the unused ones)."""
    product = tl.where(coeff_later == 0, coeff_later, coeff_later * coeff_earlier)
    error = tl.fma(coeff_later, error_earlier, tl.fma(error_later, coeff_earlier,
                                                      tl.fma(coeff_later, coeff_earlier, -product)))
    advanced = tl.where(coeff_later == 0, input_later,
                        tl.fma(coeff_later, input_earlier, tl.fma(error_later, input_earlier, input_later)))
    return product, advanced, tl.where(product == 0, 0.0, error)


@triton.jit
def _advance(coeff, error, state, value):
    """``(coeff + error) * state + value``, ``error`` the rounding error of ``coeff``; a coefficient of
    exactly 0 drops the state."""
    return _compose_compensated(coeff, state, error, coeff, value, error)[1]


@triton.jit
def _times(coeff_later, error_later, coeff_earlier, error_earlier):
    """The product of two coefficients known as coeff + error each, and its error."""
    product, _advanced, error = _compose_compensated(coeff_earlier, coeff_earlier, error_earlier, coeff_later,
                                                     coeff_later, error_later)
    return product, error


@triton.jit
def _compose(coeff_earlier, input_earlier, coeff_later, input_later):
    # y -> c1*y + x1 followed by y -> c2*y + x2 is y -> (c2*c1)*y + (c2*x1 + x2); c2 = 0 is constant.
    return tl.where(coeff_later == 0, coeff_later, coeff_later * coeff_earlier), \
        tl.where(coeff_later == 0, input_later, coeff_later * input_earlier + input_later)


@triton.jit
def _scan(coeffs, values, REVERSE: tl.constexpr, COMPENSATED: tl.constexpr):
    """The inclusive scan of a tile's maps along axis 0: coefficients, values and the coefficients'
    rounding errors (zero unless COMPENSATED)."""
    if COMPENSATED:
        return tl.associative_scan((coeffs, values, tl.zeros_like(coeffs)), 0, _compose_compensated, reverse=REVERSE)
    scanned_coeffs, scanned_values = tl.associative_scan((coeffs, values), 0, _compose, reverse=REVERSE)
    return scanned_coeffs, scanned_values, tl.zeros_like(scanned_coeffs)


@triton.jit
def _apply(coeff, state, value):
    """``coeff * state + value``; a coefficient of exactly 0 drops the state."""
    return tl.where(coeff == 0, value, tl.fma(coeff, state, value))


@triton.jit
def _sum_pairs(value_a, marker_a, value_b, marker_b):
    return value_a + value_b, marker_a + marker_b


@triton.jit
def _sum_triples(value_a, coeff_a, error_a, value_b, coeff_b, error_b):
    return value_a + value_b, coeff_a + coeff_b, error_a + error_b


@triton.jit
def _chunk_end(scanned_coeffs, scanned_errors, results, product, product_error, last, AGGREGATE: tl.constexpr,
               BLOCK_L: tl.constexpr):
    """The state after a chunk, its result at row ``last`` (the last in scan order: positions past the end
    read the identity); with AGGREGATE the product of the segment's coefficients so far (and its error)
    times the chunk's, else per column the sum of ``results * 0``: 0, or NaN where a result is not finite.
    One reduction over the tile picks the row and sums the markers (two reductions wait on the GPU for
    twice the shared-memory round trips)."""
    is_last = tl.arange(0, BLOCK_L)[:, None] == last
    zeros = tl.zeros_like(results)
    if AGGREGATE:
        carry, chunk_product, chunk_error = tl.reduce(
            (tl.where(is_last, results, zeros), tl.where(is_last, scanned_coeffs, zeros),
             tl.where(is_last, scanned_errors, zeros)), 0, _sum_triples)
        product, product_error = _times(chunk_product, chunk_error, product, product_error)
        nonfinite = tl.zeros_like(carry)
    else:
        carry, nonfinite = tl.reduce((tl.where(is_last, results, zeros), results * 0.0), 0, _sum_pairs)
    return carry, product, product_error, nonfinite


@triton.jit
def _nonfinite(values):
    return (values != values) | (tl.abs(values) == float("inf"))


@triton.jit
def _first_steps(positions, valid, length, cu_seqlens_ptr, sequence_ptr, REVERSE: tl.constexpr,
                 PACKED: tl.constexpr):
    """For each position of a chunk: whether it is the first step of its sequence, and that sequence's
    index (0 without packing)."""
    if PACKED:
        sequence = tl.load(sequence_ptr + positions, mask=valid, other=0).to(positions.dtype)
        if REVERSE:
            first = tl.load(cu_seqlens_ptr + sequence + 1, mask=valid, other=0) - 1
        else:
            first = tl.load(cu_seqlens_ptr + sequence, mask=valid, other=0)
        return (positions == first) & valid, sequence
    first_position = length - 1 if REVERSE else 0
    return positions == first_position, tl.zeros_like(positions)


@triton.jit
def _load_coeffs(pointers, mask, ACC: tl.constexpr, LOG_COEFFS: tl.constexpr):
    """Coefficients in the accumulator type; masked positions read the identity (1)."""
    if LOG_COEFFS:
        return tl.exp(tl.load(pointers, mask=mask, other=0.0).to(ACC))
    return tl.load(pointers, mask=mask, other=1.0).to(ACC)


@triton.jit
def _program_tile(channels, rows, batch1, channel_blocks, segment_length, length, BLOCK_C: tl.constexpr,
                  INDEX_64: tl.constexpr):
    """The program's segment, batch indices, channel columns, and its segment's bounds along time."""
    program = tl.program_id(0)
    channel_block = program % channel_blocks
    row = (program // channel_blocks) % rows
    segment = program // (channel_blocks * rows)
    b0, b1 = row // batch1, row % batch1
    cols = channel_block * BLOCK_C + tl.arange(0, BLOCK_C)
    if INDEX_64:
        b0, b1, cols = b0.to(tl.int64), b1.to(tl.int64), cols.to(tl.int64)
    segment_start = segment * segment_length
    segment_end = tl.minimum(segment_start + segment_length, length)
    # Offset of the program's (segment, row, channels) in the contiguous carries, products and flags buffers.
    state_offset = (segment * rows + row) * channels + cols
    return segment, b0, b1, cols, segment_start, segment_end, state_offset


@triton.jit
def _carry_in(states_ptr, state_offset, segment, rows, channels, length, segment_length, col_valid, first_carry,
              FROM_END: tl.constexpr):
    """The state entering a segment: the state leaving the segment before it in scan order (the one after
    it in time FROM_END), which ``states`` holds, or ``first_carry`` for the first."""
    previous = segment + 1 if FROM_END else segment - 1
    # A (BLOCK_C,) mask: the interpreter combines a scalar mask and a vector one into integers.
    previous_of_columns = tl.zeros_like(state_offset) + previous
    has_previous = (previous_of_columns >= 0) & (previous_of_columns < tl.cdiv(length, segment_length))
    carry = tl.load(states_ptr + state_offset + (previous - segment) * rows * channels, mask=col_valid & has_previous,
                    other=0.0)
    return tl.where(has_previous, carry.to(first_carry.dtype), first_carry)


@triton.jit
def _chunk_positions(segment_start, segment_end, chunk, col_valid, BLOCK_L: tl.constexpr, INDEX_64: tl.constexpr):
    """The time positions of chunk ``chunk`` of a segment, which of them are in it, and the (BLOCK_L, BLOCK_C)
    mask of its valid elements."""
    positions = segment_start + chunk * BLOCK_L + tl.arange(0, BLOCK_L)
    valid = positions < segment_end
    if INDEX_64:
        positions = positions.to(tl.int64)
    return positions, valid, valid[:, None] & col_valid[None, :]


@triton.jit
def _store_aggregate(carries_ptr, products_ptr, flags_ptr, state_offset, segment, carry, product, product_error,
                     col_valid):
    """A segment's map: its final state from zero and its product of coefficients (error folded in, in float64).
    The first segment's programs clear their columns' flags, which the CARRY_IN pass sets."""
    tl.store(carries_ptr + state_offset, carry, mask=col_valid)
    tl.store(products_ptr + state_offset, product.to(tl.float64) + product_error.to(tl.float64), mask=col_valid)
    if segment == 0:
        tl.store(flags_ptr + state_offset, tl.zeros_like(state_offset).to(tl.int32), mask=col_valid)


@triton.jit
def _flag(flags_ptr, state_offset, segment, rows, channels, flagged):
    """Sets the (rows, channels) flags of a segment's flagged columns: one atomic per column that holds a
    non-finite result, none where all are finite."""
    tl.atomic_or(flags_ptr + state_offset - segment * rows * channels, tl.full(flagged.shape, 1, tl.int32),
                 mask=flagged)


@triton.jit
def _any(flagged):
    """Whether any element of a (BLOCK_C,) mask is set, as a scalar."""
    return tl.max(flagged.to(tl.int32), axis=0) != 0


@triton.jit
def linrec_forward_kernel(
    inputs_ptr, coeffs_ptr, outputs_ptr, initial_ptr, cu_seqlens_ptr, sequence_ptr, carries_ptr, products_ptr,
    flags_ptr, length, channels, rows, batch1, channel_blocks, segment_length, sequences,
    inputs_b0, inputs_b1, inputs_l, inputs_c,
    coeffs_b0, coeffs_b1, coeffs_l, coeffs_c,
    outputs_b0, outputs_b1, outputs_l, outputs_c,
    initial_b0, initial_b1, initial_c, initial_sequence,
    REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, PACKED: tl.constexpr, LOG_COEFFS: tl.constexpr,
    AGGREGATE: tl.constexpr, CARRY_IN: tl.constexpr, ACC: tl.constexpr, INDEX_64: tl.constexpr,
    COMPENSATED: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """CARRY_IN reads the states leaving the segments from ``carries`` and sets the (rows, channels) int32
    ``flags`` of columns with a non-finite result, which AGGREGATE clears; without AGGREGATE or CARRY_IN
    the program rescans its flagged columns itself. ``sequences`` counts the packed sequences."""
    segment, b0, b1, cols, segment_start, segment_end, state_offset = _program_tile(
        channels, rows, batch1, channel_blocks, segment_length, length, BLOCK_C, INDEX_64)
    col_valid = cols < channels
    inputs_row = inputs_ptr + b0 * inputs_b0 + b1 * inputs_b1 + cols * inputs_c
    coeffs_row = coeffs_ptr + b0 * coeffs_b0 + b1 * coeffs_b1 + cols * coeffs_c
    outputs_row = outputs_ptr + b0 * outputs_b0 + b1 * outputs_b1 + cols * outputs_c
    initial_row = initial_ptr + b0 * initial_b0 + b1 * initial_b1 + cols * initial_c

    # The state entering the next chunk; the initial state folds in as a carry when there is one sequence
    # (the first segment of a split call enters with it, and the aggregates apply it to the others).
    carry = tl.zeros([BLOCK_C], dtype=ACC)
    if HAS_INITIAL and not PACKED and not AGGREGATE:
        carry = tl.sum(tl.load(initial_row[None, :], mask=col_valid[None, :], other=0.0).to(ACC), axis=0)
    if CARRY_IN:
        carry = _carry_in(carries_ptr, state_offset, segment, rows, channels, length, segment_length, col_valid, carry,
                          REVERSE)
    product = tl.full([BLOCK_C], 1.0, dtype=ACC)
    product_error = tl.zeros([BLOCK_C], dtype=ACC)
    nonfinite = tl.zeros([BLOCK_C], dtype=ACC)  # results * 0 summed: NaN where a result is not finite
    last = 0 if REVERSE else BLOCK_L - 1  # the tile's last row in scan order
    chunks = tl.cdiv(segment_end - segment_start, BLOCK_L)
    for step in range(0, chunks):
        chunk = chunks - 1 - step if REVERSE else step
        positions, valid, mask = _chunk_positions(segment_start, segment_end, chunk, col_valid, BLOCK_L, INDEX_64)
        inputs = tl.load(inputs_row[None, :] + positions[:, None] * inputs_l, mask=mask, other=0.0).to(ACC)
        coeffs = _load_coeffs(coeffs_row[None, :] + positions[:, None] * coeffs_l, mask, ACC, LOG_COEFFS)
        first, sequence = _first_steps(positions, valid, length, cu_seqlens_ptr, sequence_ptr, REVERSE, PACKED)
        first = first[:, None]
        if HAS_INITIAL and PACKED:
            initial = tl.load(initial_row[None, :] + sequence[:, None] * initial_sequence, mask=first & mask,
                              other=0.0)
            inputs = tl.where(first, inputs + coeffs * initial.to(ACC), inputs)
        if PACKED or not HAS_INITIAL:
            coeffs = tl.where(first, tl.zeros_like(coeffs), coeffs)
        scanned_coeffs, scanned_inputs, scanned_errors = _scan(coeffs, inputs, REVERSE, COMPENSATED)
        if COMPENSATED:
            outputs = _advance(scanned_coeffs, scanned_errors, carry[None, :], scanned_inputs)
        else:
            outputs = _apply(scanned_coeffs, carry[None, :], scanned_inputs)
        if not AGGREGATE:
            tl.store(outputs_row[None, :] + positions[:, None] * outputs_l, outputs.to(outputs_ptr.dtype.element_ty),
                     mask=mask)
        carry, product, product_error, chunk_nonfinite = _chunk_end(scanned_coeffs, scanned_errors, outputs, product,
                                                                    product_error, last, AGGREGATE, BLOCK_L)
        nonfinite += chunk_nonfinite
    if AGGREGATE:
        _store_aggregate(carries_ptr, products_ptr, flags_ptr, state_offset, segment, carry, product, product_error,
                         col_valid)
    else:
        flagged = (nonfinite != 0) & col_valid
        if CARRY_IN:
            _flag(flags_ptr, state_offset, segment, rows, channels, flagged)
        elif _any(flagged):
            tl.debug_barrier()  # the outputs every thread stored, visible to the threads that rescan them
            _rescan_forward(inputs_row, coeffs_row, outputs_row, initial_row, cu_seqlens_ptr, flagged, sequences,
                            length, inputs_l, coeffs_l, outputs_l, initial_sequence, REVERSE, HAS_INITIAL, PACKED,
                            LOG_COEFFS, ACC, BLOCK_C)


@triton.jit
def linrec_backward_kernel(
    d_outputs_ptr, coeffs_ptr, outputs_ptr, initial_ptr, cu_seqlens_ptr, sequence_ptr,
    d_inputs_ptr, d_coeffs_ptr, d_initial_ptr, carries_ptr, products_ptr, flags_ptr,
    length, channels, rows, batch1, channel_blocks, segment_length, sequences, d_coeffs_segment,
    d_outputs_b0, d_outputs_b1, d_outputs_l, d_outputs_c,
    coeffs_b0, coeffs_b1, coeffs_l, coeffs_c,
    outputs_b0, outputs_b1, outputs_l, outputs_c,
    initial_b0, initial_b1, initial_c, initial_sequence,
    d_inputs_b0, d_inputs_b1, d_inputs_l, d_inputs_c,
    d_coeffs_b0, d_coeffs_b1, d_coeffs_l, d_coeffs_c,
    REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, PACKED: tl.constexpr, LOG_COEFFS: tl.constexpr,
    SUM_COEFFS_OVER_TIME: tl.constexpr, AGGREGATE: tl.constexpr, CARRY_IN: tl.constexpr, ACC: tl.constexpr,
    INDEX_64: tl.constexpr, COMPENSATED: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """d_initial has initial's strides. With SUM_COEFFS_OVER_TIME (coeffs broadcast along time) each
    program sums d_coeffs over its segment and stores one (BLOCK_C,) row at time position 0, segments
    ``d_coeffs_segment`` apart. AGGREGATE computes d_inputs' composed map only (no d_coeffs). Flags and
    rescans follow d_inputs, as the forward kernel's follow its outputs."""
    segment, b0, b1, cols, segment_start, segment_end, state_offset = _program_tile(
        channels, rows, batch1, channel_blocks, segment_length, length, BLOCK_C, INDEX_64)
    col_valid = cols < channels
    d_outputs_row = d_outputs_ptr + b0 * d_outputs_b0 + b1 * d_outputs_b1 + cols * d_outputs_c
    coeffs_row = coeffs_ptr + b0 * coeffs_b0 + b1 * coeffs_b1 + cols * coeffs_c
    outputs_row = outputs_ptr + b0 * outputs_b0 + b1 * outputs_b1 + cols * outputs_c
    initial_offset = b0 * initial_b0 + b1 * initial_b1 + cols * initial_c
    initial_row = initial_ptr + initial_offset
    d_initial_row = d_initial_ptr + initial_offset
    d_inputs_row = d_inputs_ptr + b0 * d_inputs_b0 + b1 * d_inputs_b1 + cols * d_inputs_c
    d_coeffs_row = d_coeffs_ptr + b0 * d_coeffs_b0 + b1 * d_coeffs_b1 + cols * d_coeffs_c + segment * d_coeffs_segment

    step_along = -1 if REVERSE else 1  # from a position to the next one of the recurrence
    carry = tl.zeros([BLOCK_C], dtype=ACC)  # d_inputs at the next position, entering the chunk
    if CARRY_IN:
        carry = _carry_in(carries_ptr, state_offset, segment, rows, channels, length, segment_length, col_valid, carry,
                          not REVERSE)
    product = tl.full([BLOCK_C], 1.0, dtype=ACC)
    product_error = tl.zeros([BLOCK_C], dtype=ACC)
    d_coeffs_sum = tl.zeros([BLOCK_C], dtype=ACC)
    nonfinite = tl.zeros([BLOCK_C], dtype=ACC)  # d_inputs * 0 summed: NaN where one is not finite
    last = BLOCK_L - 1 if REVERSE else 0  # the tile's last row in scan order
    chunks = tl.cdiv(segment_end - segment_start, BLOCK_L)
    for step in range(0, chunks):
        chunk = step if REVERSE else chunks - 1 - step
        positions, valid, mask = _chunk_positions(segment_start, segment_end, chunk, col_valid, BLOCK_L, INDEX_64)
        first, sequence = _first_steps(positions, valid, length, cu_seqlens_ptr, sequence_ptr, REVERSE, PACKED)
        # The coefficient that carries d_inputs back from the next position: zero past the sequence's end.
        following = positions + step_along
        has_following = valid & (following >= 0) & (following < length)
        if PACKED:
            following_first, _ = _first_steps(following, has_following, length, cu_seqlens_ptr, sequence_ptr,
                                              REVERSE, PACKED)
            has_following = has_following & ~following_first
        following_mask = has_following[:, None] & col_valid[None, :]
        following_coeffs = _load_coeffs(coeffs_row[None, :] + following[:, None] * coeffs_l, following_mask, ACC,
                                        LOG_COEFFS)
        following_coeffs = tl.where(following_mask, following_coeffs, tl.zeros_like(following_coeffs))
        d_outputs = tl.load(d_outputs_row[None, :] + positions[:, None] * d_outputs_l, mask=mask, other=0.0).to(ACC)
        scanned_coeffs, scanned, scanned_errors = _scan(following_coeffs, d_outputs, not REVERSE, COMPENSATED)
        if COMPENSATED:
            d_inputs = _advance(scanned_coeffs, scanned_errors, carry[None, :], scanned)
        else:
            d_inputs = _apply(scanned_coeffs, carry[None, :], scanned)
        carry, product, product_error, chunk_nonfinite = _chunk_end(scanned_coeffs, scanned_errors, d_inputs, product,
                                                                    product_error, last, AGGREGATE, BLOCK_L)
        nonfinite += chunk_nonfinite
        if not AGGREGATE:
            tl.store(d_inputs_row[None, :] + positions[:, None] * d_inputs_l,
                     d_inputs.to(d_inputs_ptr.dtype.element_ty), mask=mask)
            d_coeffs = _coefficient_gradients(
                d_inputs, first, sequence, positions, mask, step_along, coeffs_row[None, :], coeffs_l,
                outputs_row[None, :], outputs_l, initial_row[None, :], initial_sequence, d_initial_row[None, :],
                HAS_INITIAL, LOG_COEFFS, ACC)
            if SUM_COEFFS_OVER_TIME:
                d_coeffs_sum += tl.sum(d_coeffs, axis=0)
            else:
                tl.store(d_coeffs_row[None, :] + positions[:, None] * d_coeffs_l,
                         d_coeffs.to(d_coeffs_ptr.dtype.element_ty), mask=mask)
    if AGGREGATE:
        _store_aggregate(carries_ptr, products_ptr, flags_ptr, state_offset, segment, carry, product, product_error,
                         col_valid)
    else:
        if SUM_COEFFS_OVER_TIME:
            tl.store(d_coeffs_row, d_coeffs_sum.to(d_coeffs_ptr.dtype.element_ty), mask=col_valid)
        flagged = (nonfinite != 0) & col_valid
        if CARRY_IN:
            _flag(flags_ptr, state_offset, segment, rows, channels, flagged)
        elif _any(flagged):
            tl.debug_barrier()  # the gradients every thread stored, visible to the threads that rescan them
            _rescan_backward(d_outputs_row, coeffs_row, outputs_row, initial_row, cu_seqlens_ptr, d_inputs_row,
                             d_coeffs_row, d_initial_row, flagged, sequences, length, d_outputs_l, coeffs_l, outputs_l,
                             initial_sequence, d_inputs_l, d_coeffs_l, REVERSE, HAS_INITIAL, PACKED, LOG_COEFFS,
                             not SUM_COEFFS_OVER_TIME, ACC, BLOCK_C)


@triton.jit
def _coefficient_gradients(d_inputs, first, sequence, positions, mask, step_along, coeffs_ptr, coeffs_l, outputs_ptr,
                           outputs_l, initial_ptr, initial_sequence, d_initial_ptr, HAS_INITIAL: tl.constexpr,
                           LOG_COEFFS: tl.constexpr, ACC: tl.constexpr):
    """A chunk's d_coeffs, and d_initial stored at first steps."""
    # d_coeffs[l] = d_inputs[l] * state before l: outputs at the previous position, initial at a first step.
    first = first[:, None]
    previous = positions - step_along
    previous_states = tl.load(outputs_ptr + previous[:, None] * outputs_l, mask=mask & ~first, other=0.0).to(ACC)
    if HAS_INITIAL:
        initial_pointers = initial_ptr + sequence[:, None] * initial_sequence
        initial = tl.load(initial_pointers, mask=mask & first, other=0.0).to(ACC)
        previous_states = tl.where(first, initial, previous_states)
    d_coeffs = d_inputs * previous_states
    if LOG_COEFFS or HAS_INITIAL:
        coeffs = _load_coeffs(coeffs_ptr + positions[:, None] * coeffs_l, mask, ACC, LOG_COEFFS)
        if LOG_COEFFS:
            d_coeffs = d_coeffs * coeffs  # d c = c d log c
        if HAS_INITIAL:
            d_initial = coeffs * d_inputs
            tl.store(d_initial_ptr + sequence[:, None] * initial_sequence,
                     d_initial.to(d_initial_ptr.dtype.element_ty), mask=mask & first)
    if not HAS_INITIAL:
        # A first step's coefficient multiplies the zero state: its gradient is 0 whatever d_inputs and the
        # coefficient hold (0 * Inf, from an infinite log coefficient or d_inputs, is not the loop's answer).
        mask = mask & ~first
    return tl.where(mask, d_coeffs, tl.zeros_like(d_coeffs))


@triton.jit
def _sequence_bounds(cu_seqlens_ptr, sequence, length, PACKED: tl.constexpr):
    """[begin, end) along time of packed sequence ``sequence``, or of the whole row, as int64 either way:
    the compiler requires one return type of every branch, and offsets may be int32 or int64."""
    if PACKED:
        begin = tl.load(cu_seqlens_ptr + sequence).to(tl.int64)
        end = tl.load(cu_seqlens_ptr + sequence + 1).to(tl.int64)
    else:
        begin = tl.full([], 0, tl.int64)
        end = begin + length
    return begin, end


#: Elements of a (steps, columns) tile of the rescans' search for a first non-finite value and of their
#: NaN fill: a row of time-last rows (one column) is read or filled 4096 steps a tile (with 64, an all-NaN
#: float32 2048 x 16384 forward read 0.18 of torch.add against 0.53 finite).
FILL_ELEMENTS: tl.constexpr = tl.constexpr(4096)


@triton.jit
def _first_nonfinite(pointers, stride, begin, end, mask, REVERSE: tl.constexpr, ACC: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """Per column, the steps in scan order before the first non-finite value at [begin, end) along time
    (end - begin where there is none): BLOCK_T steps a load, until every ``mask`` column has one."""
    steps = end - begin
    first = tl.zeros([BLOCK_C], dtype=tl.int32) + steps
    base = steps * 0
    searching = _any(mask)
    while searching:
        n = base + tl.arange(0, BLOCK_T)[:, None]
        t = end - 1 - n if REVERSE else begin + n
        valid = mask[None, :] & (n < steps)
        values = tl.load(pointers[None, :] + t * stride, mask=valid, other=0.0).to(ACC)
        first = tl.minimum(first, tl.min(tl.where(_nonfinite(values) & valid, n, steps), axis=0))
        base += BLOCK_T
        searching = (base < steps) & _any(mask & (first == steps))
    return first


@triton.jit
def _fill_past_nan(pointers, stride, begin, end, columns, stop, first, REVERSE: tl.constexpr,
                   ZERO_LAST: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """Stores NaN at the steps after ``stop`` (and from ``first`` on) of ``columns``, in scan order: past
    a NaN state every result is NaN, whatever the operands, so they are not read. ``ZERO_LAST``: 0 at the
    last step (the backward's d_coeffs of the forward's first step without an initial state)."""
    steps = end - begin
    for base in range(tl.min(tl.where(columns, stop + 1, steps), axis=0), steps, BLOCK_T):
        n = base + tl.arange(0, BLOCK_T)[:, None]
        t = end - 1 - n if REVERSE else begin + n
        value = tl.full([BLOCK_T, BLOCK_C], float("nan"), tl.float32)
        if ZERO_LAST:
            value = tl.where(n == steps - 1, 0.0, value)
        tl.store(pointers[None, :] + t * stride, value.to(pointers.dtype.element_ty),
                 mask=columns[None, :] & (n > stop[None, :]) & (n >= first[None, :]) & (n < steps))


@triton.jit
def _rescan_forward(inputs_row, coeffs_row, outputs_row, initial_row, cu_seqlens_ptr, flagged, sequences, length,
                    inputs_l, coeffs_l, outputs_l, initial_sequence, REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr,
                    PACKED: tl.constexpr, LOG_COEFFS: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr):
    """The loop over the packed sequences (whole rows without packing) of the ``flagged`` (row, channel)
    columns whose outputs hold a non-finite value: the recurrence's IEEE answer, which the parallel scan's
    products of coefficients can miss (csrc/include/linrec/nonfinite_rescan.h says why), stored from the
    first non-finite output on. A column's loop stops at a NaN state, and the rest is filled with NaN.
    The ``*_row`` pointers address the columns' first time steps."""
    for sequence in range(0, tl.where(_any(flagged), sequences, 0)):
        begin, end = _sequence_bounds(cu_seqlens_ptr, sequence, length, PACKED)
        steps = end - begin
        first = _first_nonfinite(outputs_row, outputs_l, begin, end, flagged, REVERSE, ACC, BLOCK_C,
                                 FILL_ELEMENTS // BLOCK_C)
        rescanned = flagged & (first < steps)
        state = tl.zeros([BLOCK_C], dtype=ACC)
        if HAS_INITIAL:
            state = tl.load(initial_row + sequence * initial_sequence, mask=rescanned, other=0.0).to(ACC)
        walking, stop = rescanned, tl.zeros([BLOCK_C], dtype=tl.int32) + steps  # stop: the step turned NaN
        n = steps * 0
        going = _any(walking)
        while going:
            t = end - 1 - n if REVERSE else begin + n
            x = tl.load(inputs_row + t * inputs_l, mask=walking, other=0.0).to(ACC)
            c = _load_coeffs(coeffs_row + t * coeffs_l, walking, ACC, LOG_COEFFS)
            if HAS_INITIAL:
                state = c * state + x
            else:
                state = tl.where(n == 0, x, c * state + x)
            tl.store(outputs_row + t * outputs_l, state.to(outputs_row.dtype.element_ty), mask=walking & (n >= first))
            turned = walking & (state != state)
            stop = tl.where(turned, n, stop)
            walking = walking & ~turned
            n += 1
            going = (n < steps) & _any(walking)
        _fill_past_nan(outputs_row, outputs_l, begin, end, rescanned & (stop < steps), stop, first, REVERSE, False,
                       BLOCK_C, FILL_ELEMENTS // BLOCK_C)


@triton.jit
def _rescan_backward(d_outputs_row, coeffs_row, outputs_row, initial_row, cu_seqlens_ptr, d_inputs_row, d_coeffs_row,
                     d_initial_row, flagged, sequences, length, d_outputs_l, coeffs_l, outputs_l, initial_sequence,
                     d_inputs_l, d_coeffs_l, REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, PACKED: tl.constexpr,
                     LOG_COEFFS: tl.constexpr, STORE_COEFFS: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr):
    """The backward's loop over the ``flagged`` columns' sequences whose d_inputs hold a non-finite value:
    d_inputs, d_coeffs per element (STORE_COEFFS; a sum over time is left as the backward kernel made it)
    and d_initial, as ``_rescan_forward`` rescans the forward (a NaN gradient state makes every later
    gradient NaN, but the forward's first step's d_coeffs without an initial state, which is 0)."""
    step = 1 if REVERSE else -1  # from a position to the one before it in the forward scan
    for sequence in range(0, tl.where(_any(flagged), sequences, 0)):
        begin, end = _sequence_bounds(cu_seqlens_ptr, sequence, length, PACKED)
        steps = end - begin
        first = _first_nonfinite(d_inputs_row, d_inputs_l, begin, end, flagged, not REVERSE, ACC, BLOCK_C,
                                 FILL_ELEMENTS // BLOCK_C)
        rescanned = flagged & (first < steps)
        d_state = tl.zeros([BLOCK_C], dtype=ACC)
        next_coeff = tl.zeros([BLOCK_C], dtype=ACC)
        walking, stop = rescanned, tl.zeros([BLOCK_C], dtype=tl.int32) + steps
        n = steps * 0
        going = _any(walking)
        while going:
            t = begin + n if REVERSE else end - 1 - n
            g = tl.load(d_outputs_row + t * d_outputs_l, mask=walking, other=0.0).to(ACC)
            d_state = next_coeff * d_state + g
            c = _load_coeffs(coeffs_row + t * coeffs_l, walking, ACC, LOG_COEFFS)
            stored = walking & (n >= first)
            tl.store(d_inputs_row + t * d_inputs_l, d_state.to(d_inputs_row.dtype.element_ty), mask=stored)
            if STORE_COEFFS:
                has_previous = tl.zeros([BLOCK_C], dtype=tl.int32) + (n + 1) < steps
                previous = tl.load(outputs_row + (t + step) * outputs_l, mask=walking & has_previous,
                                   other=0.0).to(ACC)
                if HAS_INITIAL:
                    first_state = tl.load(initial_row + sequence * initial_sequence, mask=walking,
                                          other=0.0).to(ACC)
                    previous = tl.where(has_previous, previous, first_state)
                d_coeff = d_state * previous
                if LOG_COEFFS:
                    d_coeff = d_coeff * c
                if not HAS_INITIAL:
                    d_coeff = tl.where(has_previous, d_coeff, tl.zeros_like(d_coeff))
                tl.store(d_coeffs_row + t * d_coeffs_l, d_coeff.to(d_coeffs_row.dtype.element_ty), mask=stored)
            next_coeff = c
            turned = walking & (d_state != d_state)
            stop = tl.where(turned, n, stop)
            walking = walking & ~turned
            n += 1
            going = (n < steps) & _any(walking)
        nan_columns = rescanned & (stop < steps)
        _fill_past_nan(d_inputs_row, d_inputs_l, begin, end, nan_columns, stop, first, not REVERSE, False, BLOCK_C,
                       FILL_ELEMENTS // BLOCK_C)
        if STORE_COEFFS:
            _fill_past_nan(d_coeffs_row, d_coeffs_l, begin, end, nan_columns, stop, first, not REVERSE,
                           not HAS_INITIAL, BLOCK_C, FILL_ELEMENTS // BLOCK_C)
        if HAS_INITIAL:  # NaN where the state turned NaN: NaN times any coefficient
            tl.store(d_initial_row + sequence * initial_sequence,
                     (next_coeff * d_state).to(d_initial_row.dtype.element_ty), mask=rescanned)


@triton.jit
def _flagged_columns(flags_ptr, channels, batch1, channel_blocks, BLOCK_C: tl.constexpr):
    """A rescan program's row (as its two batch indices), its BLOCK_C channel columns, and which of them
    the scan flagged."""
    program = tl.program_id(0)
    row = program // channel_blocks
    cols = (program % channel_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    flagged = tl.load(flags_ptr + row * channels + cols, mask=cols < channels, other=0) != 0
    return row // batch1, row % batch1, cols, flagged


@triton.jit
def linrec_rescan_forward_kernel(
    inputs_ptr, coeffs_ptr, outputs_ptr, initial_ptr, cu_seqlens_ptr, flags_ptr,
    length, channels, batch1, channel_blocks, sequences,
    inputs_b0, inputs_b1, inputs_l, inputs_c,
    coeffs_b0, coeffs_b1, coeffs_l, coeffs_c,
    outputs_b0, outputs_b1, outputs_l, outputs_c,
    initial_b0, initial_b1, initial_c, initial_sequence,
    REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, PACKED: tl.constexpr, LOG_COEFFS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """The rescan of a split call, after its last pass: a program takes a row and BLOCK_C channels, and
    where the forward kernel flagged none of them its loops have no steps."""
    b0, b1, cols, flagged = _flagged_columns(flags_ptr, channels, batch1, channel_blocks, BLOCK_C)
    _rescan_forward(inputs_ptr + b0 * inputs_b0 + b1 * inputs_b1 + cols * inputs_c,
                    coeffs_ptr + b0 * coeffs_b0 + b1 * coeffs_b1 + cols * coeffs_c,
                    outputs_ptr + b0 * outputs_b0 + b1 * outputs_b1 + cols * outputs_c,
                    initial_ptr + b0 * initial_b0 + b1 * initial_b1 + cols * initial_c, cu_seqlens_ptr, flagged,
                    sequences, length, inputs_l, coeffs_l, outputs_l, initial_sequence, REVERSE, HAS_INITIAL, PACKED,
                    LOG_COEFFS, ACC, BLOCK_C)


@triton.jit
def linrec_rescan_backward_kernel(
    d_outputs_ptr, coeffs_ptr, outputs_ptr, initial_ptr, cu_seqlens_ptr, d_inputs_ptr, d_coeffs_ptr, d_initial_ptr,
    flags_ptr, length, channels, batch1, channel_blocks, sequences,
    d_outputs_b0, d_outputs_b1, d_outputs_l, d_outputs_c,
    coeffs_b0, coeffs_b1, coeffs_l, coeffs_c,
    outputs_b0, outputs_b1, outputs_l, outputs_c,
    initial_b0, initial_b1, initial_c, initial_sequence,
    d_inputs_b0, d_inputs_b1, d_inputs_l, d_inputs_c,
    d_coeffs_b0, d_coeffs_b1, d_coeffs_l, d_coeffs_c,
    REVERSE: tl.constexpr, HAS_INITIAL: tl.constexpr, PACKED: tl.constexpr, LOG_COEFFS: tl.constexpr,
    STORE_COEFFS: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """The backward's rescan of a split call, as linrec_rescan_forward_kernel rescans the forward."""
    b0, b1, cols, flagged = _flagged_columns(flags_ptr, channels, batch1, channel_blocks, BLOCK_C)
    initial_offset = b0 * initial_b0 + b1 * initial_b1 + cols * initial_c
    _rescan_backward(d_outputs_ptr + b0 * d_outputs_b0 + b1 * d_outputs_b1 + cols * d_outputs_c,
                     coeffs_ptr + b0 * coeffs_b0 + b1 * coeffs_b1 + cols * coeffs_c,
                     outputs_ptr + b0 * outputs_b0 + b1 * outputs_b1 + cols * outputs_c,
                     initial_ptr + initial_offset, cu_seqlens_ptr,
                     d_inputs_ptr + b0 * d_inputs_b0 + b1 * d_inputs_b1 + cols * d_inputs_c,
                     d_coeffs_ptr + b0 * d_coeffs_b0 + b1 * d_coeffs_b1 + cols * d_coeffs_c,
                     d_initial_ptr + initial_offset, flagged, sequences, length, d_outputs_l, coeffs_l, outputs_l,
                     initial_sequence, d_inputs_l, d_coeffs_l, REVERSE, HAS_INITIAL, PACKED, LOG_COEFFS, STORE_COEFFS,
                     ACC, BLOCK_C)
