"""The CPU kernels at the edges of their vector lanes, blocks and threads, on the CPU only.

- Lane remainders: every length 1..70 of time-contiguous rows (under 16 steps the plain recurrence
  runs them, or the channel kernels a single step: launch.h) and every channel count 1..70 of the
  (batch, time, channels) layout, for every dtype, direction, coefficient layout, with and without an
  initial state and log coefficients.
- Long sequences across the block and thread boundaries a sequence may be split at, packed or not.
- Bitwise equal outputs and gradients for every thread count.
- Many short packed sequences (empty ones, single steps, longer than a vector group).
- A non-finite first coefficient, which takes no part without an initial state, on the vector paths.

Outputs and gradients (inputs, coeffs and initial, by autograd with fresh random upstream gradients)
are checked against a float64 reference computed from the same (already rounded) values: autograd
through the package's loop recurrence (``linrec_loop``, what ``backend="loop"`` runs) or, for sequences
too long for a Python loop, through its associative-scan recurrence (``linrec_hop``: torch's
associative_scan, no linrec kernel), itself checked against the loop here. Errors are measured against
the sum of the absolute values of the terms a result adds up (the same recurrence run on absolute
values), the scale a floating-point sum's rounding error is bounded by, so that a result that cancels
towards 0 does not fail on rounding alone.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from helpers import TOLERANCE, random_coeffs, random_values, use_instruction_set, wide

import linrec
from linrec import linrec_hop, linrec_loop, linrec_reference

CPU = "cpu"
#: The thread count the kernels run under outside the thread-count tests: torch's default here.
KERNEL_THREADS = torch.get_num_threads()
KERNEL_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
THREAD_COUNTS = [1, 2, 3, 5, 8]
NAMES = ("outputs", "d_inputs", "d_coeffs", "d_initial")
#: (initial state, log coefficients): every combination is run inside each lane-remainder test.
VARIANTS = [(False, False), (True, False), (False, True), (True, True)]
#: Lengths (channel counts) 1..70: every remainder of vector widths 2, 4, 8, 16 and 32, with and
#: without full vectors (and full groups of vectors) before it.
COUNTS = range(1, 71)


def make_coeffs(shape, dtype, log_coeffs=False, min_magnitude=0.0):
    """Coefficients as the helpers draw them; with log_coeffs, log c for c in (0.5, 1)."""
    if log_coeffs:
        return random_coeffs(shape, torch.float64, min_magnitude=0.5).abs().log().to(dtype)
    return random_coeffs(shape, dtype, min_magnitude=min_magnitude)


@contextlib.contextmanager
def threads(count):
    """Runs the block on `count` intra-op threads, restoring the previous count after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def restore_thread_count():
    """Each test runs its own tensor work (drawing, the reference, comparisons) on one thread, the kernels
    on KERNEL_THREADS (or the counts it sets), and the original count is restored after it. One thread:
    on a busy machine a thread pool waiting for a descheduled thread makes each small op take
    milliseconds."""
    original = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        yield
    finally:
        torch.set_num_threads(original)


def run_kernels(inputs, coeffs, initial, d_outputs, thread_count=KERNEL_THREADS, **options):
    """The CPU kernels' outputs and gradients of inputs, coeffs (and initial) by autograd, on
    `thread_count` threads."""
    assert inputs.device == torch.device(CPU)
    leaves = [t.detach().requires_grad_() for t in (inputs, coeffs, initial) if t is not None]
    with threads(thread_count):
        assert torch.get_num_threads() == thread_count
        outputs = linrec.linrec(leaves[0], leaves[1], initial=leaves[2] if initial is not None else None, **options)
        grads = torch.autograd.grad(outputs, leaves, d_outputs)
    assert outputs.shape == inputs.shape and outputs.dtype == inputs.dtype and outputs.device == torch.device(CPU)
    return [outputs.detach(), *grads]


def reference_results(inputs, coeffs, initial, d_outputs, recurrence=linrec_loop, dim=-1, reverse=False,
                      cu_seqlens=None, log_coeffs=False):
    """Float64 outputs and gradients (inputs, coeffs, initial) by autograd through `recurrence` under
    ``linrec.linrec``'s semantics, and their magnitudes: the same from |inputs|, |coeffs| (log
    coefficients give c > 0 already), |initial| and |d_outputs|, each element the sum of the absolute
    values of its terms. Returns (results, magnitudes)."""

    def run(absolute):
        operands = [wide(t) for t in (inputs, coeffs, initial, d_outputs)]
        if absolute:
            operands = [t if t is None or (k == 1 and log_coeffs) else t.abs() for k, t in enumerate(operands)]
        x, c, h, d = operands
        leaves = [t.requires_grad_() for t in (x, c, h) if t is not None]
        outputs = linrec_reference(recurrence, x, c, dim, reverse, h, cu_seqlens, log_coeffs)
        grads = torch.autograd.grad(outputs, leaves, d, allow_unused=True, materialize_grads=True)
        return [outputs.detach(), *grads]

    return run(False), run(True)


def summed(gradient, shape):
    """A gradient with respect to expanded coefficients, summed to the coefficients' own shape."""
    return gradient if gradient.shape == shape else gradient.sum_to_size(shape)


def assert_cases_match(dtype, labels, actual, expected, magnitude):
    """Per case (labels[i]) and quantity (outputs, d_inputs, d_coeffs, d_initial): the same shape, finite,
    and max |actual - expected| / max magnitude within the dtype's tolerance. The cases' tensors are
    flattened into one, so that thousands of small cases compare in a few operations."""
    count = len(labels)
    for quantity in range(len(actual[0])):
        name = NAMES[quantity]
        a = [case[quantity] for case in actual]
        e = [case[quantity] for case in expected]
        m = [case[quantity] for case in magnitude]
        for label, got, want in zip(labels, a, e):
            assert got.shape == want.shape, f"{label}: {name} shape {tuple(got.shape)} != {tuple(want.shape)}"
        sizes = torch.tensor([t.numel() for t in e])
        if sizes.sum() == 0:
            continue
        index = torch.repeat_interleave(torch.arange(count), sizes)
        got = torch.cat([t.reshape(-1) for t in a]).to(torch.float64)
        want = torch.cat([t.reshape(-1) for t in e])
        scale = torch.cat([t.reshape(-1) for t in m])
        assert torch.isfinite(want).all() and torch.isfinite(scale).all(), f"{name}: the reference is not finite"
        nonfinite = torch.zeros(count, dtype=torch.float64).index_add_(0, index, (~torch.isfinite(got)).double())
        error = torch.zeros(count, dtype=torch.float64).scatter_reduce(
            0, index, (got - want).abs().nan_to_num(0.0), "amax")
        scale = torch.zeros(count, dtype=torch.float64).scatter_reduce(0, index, scale, "amax").clamp_min(1e-30)
        ratio = error / scale
        failing = ((ratio > TOLERANCE[dtype]) | (nonfinite > 0)).nonzero().flatten().tolist()
        assert not failing, f"{name} ({dtype}), {len(failing)} of {count} cases fail: " + "; ".join(
            f"{labels[i]}: {int(nonfinite[i])} non-finite, max error / max sum |terms| = {ratio[i]:.3g}"
            for i in failing[:6]) + f" (tolerance {TOLERANCE[dtype]:.3g})"


def check_one(dtype, label, inputs, coeffs, initial, d_outputs, actual=None, recurrence=linrec_loop, **options):
    """One case's kernel results (or `actual`, already computed) against the reference."""
    if actual is None:
        actual = run_kernels(inputs, coeffs, initial, d_outputs, **options)
    expected, magnitude = reference_results(inputs, coeffs, initial, d_outputs, recurrence, **options)
    assert_cases_match(dtype, [label], [actual], [expected], [magnitude])


def assert_bitwise_equal(actual, expected, what):
    """The same bits (torch.equal on an integer view: -0.0 differs from 0.0, NaN payloads count)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    differ = (actual.view(bits) != expected.view(bits)).sum().item()
    assert differ == 0, f"{what}: {differ} of {actual.numel()} elements differ bitwise"


def check_every_thread_count(dtype, label, inputs, coeffs, initial, d_outputs, **options):
    """Outputs and gradients of the kernels under each thread count: bitwise equal to those of the first
    count, which are within tolerance of the float64 reference (the associative-scan recurrence), and so
    then are those of every count."""
    runs = {count: run_kernels(inputs, coeffs, initial, d_outputs, count, **options) for count in THREAD_COUNTS}
    first = THREAD_COUNTS[0]
    for count, results in runs.items():
        for name, got, want in zip(NAMES, results, runs[first]):
            assert_bitwise_equal(got, want, f"{label}: {name} with {count} threads vs {first}")
    check_one(dtype, f"{label}, {first} threads", inputs, coeffs, initial, d_outputs, runs[first], linrec_hop,
              **options)


# ---------------------------------------------------------------------------------------------------
# 1a. Time-contiguous rows (rows, length), dim=-1: every length 1..70.

ROW_COEFFS = ["per_element", "per_row", "per_step"]  # (rows, length), (rows, 1), (length,)


def check_rows_every_length(dtype, rows, coeffs_layout, reverse, with_initial, log_coeffs):
    """One contiguous (rows, L) case per length L in COUNTS, against one float64 loop over all of them:
    the cases are drawn as one (cases, rows, longest) batch, case i taking the first L_i steps (the last
    with reverse), so that the padding comes after its last step in scan order; the padding's upstream
    gradients are 0, so it takes no part in the case's gradients either."""
    lengths = list(COUNTS)
    count, longest = len(lengths), max(lengths)
    steps = torch.arange(longest)
    length = torch.tensor(lengths)[:, None]
    inside = steps >= longest - length if reverse else steps < length  # (cases, longest)
    spans = [slice(longest - n, longest) if reverse else slice(0, n) for n in lengths]

    inputs = random_values((count, rows, longest), dtype)
    coeff_shape = {"per_element": (count, rows, longest), "per_row": (count, rows, 1), "per_step": (count, 1, longest)}
    coeffs = make_coeffs(coeff_shape[coeffs_layout], dtype, log_coeffs)
    initial = random_values((count, rows), dtype) if with_initial else None
    d_outputs = random_values((count, rows, longest), dtype) * inside[:, None, :]

    def case_coeffs(i):
        if coeffs_layout == "per_element":
            return coeffs[i, :, spans[i]].contiguous()
        if coeffs_layout == "per_row":
            return coeffs[i].contiguous()
        return coeffs[i, 0, spans[i]].contiguous()

    options = dict(dim=-1, reverse=reverse, log_coeffs=log_coeffs)
    actual, labels, shapes = [], [], []
    for i, n in enumerate(lengths):
        case = (inputs[i, :, spans[i]].contiguous(), case_coeffs(i), None if initial is None else initial[i].clone(),
                d_outputs[i, :, spans[i]].contiguous())
        assert case[0].is_contiguous() and case[0].shape == (rows, n)
        actual.append(run_kernels(*case, **options))
        labels.append(f"rows={rows} length={n} coeffs={tuple(case[1].shape)} reverse={reverse} "
                      f"initial={with_initial} log_coeffs={log_coeffs}")
        shapes.append(case[1].shape)

    results = reference_results(inputs, coeffs.expand(inputs.shape), initial, d_outputs, **options)
    expected = [[], []]
    for which, (outputs, d_inputs, d_coeffs, *d_initial) in enumerate(results):
        for i in range(count):
            case = [outputs[i, :, spans[i]], d_inputs[i, :, spans[i]], summed(d_coeffs[i, :, spans[i]], shapes[i])]
            expected[which].append(case + [d_initial[0][i]] if with_initial else case)
    assert_cases_match(dtype, labels, actual, *expected)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeffs_layout", ROW_COEFFS)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_time_contiguous_rows_every_length_matches_reference(seed, dtype, coeffs_layout, reverse):
    """Contiguous (rows, L) inputs scanned along the last dim, every L in 1..70 (each remainder of every
    vector width, before and after full vectors) for 1, 3 and 17 rows, with and without an initial
    state and log coefficients: outputs and every gradient match the float64 loop reference."""
    for rows in (1, 3, 17):
        for with_initial, log_coeffs in VARIANTS:
            check_rows_every_length(dtype, rows, coeffs_layout, reverse, with_initial, log_coeffs)


# ---------------------------------------------------------------------------------------------------
# 1b. Channel-contiguous (batch, time, channels), dim=1: every channel count 1..70.

CHANNEL_COEFFS = ["per_element", "per_channel", "per_batch_time"]  # (B, T, C), (C,), (B, T, 1)
BATCH_TIME = [(1, 1), (2, 2), (1, 7), (2, 33)]


def check_channels_every_count(dtype, batch, time, coeffs_layout, reverse, with_initial, log_coeffs):
    """One contiguous (batch, time, C) case per C in COUNTS, against one float64 loop over all of them:
    the cases are drawn as one (batch, time, sum C) batch, case i taking its own channels (along which
    the recurrence does not mix)."""
    channels = list(COUNTS)
    count, total = len(channels), sum(channels)
    bounds = torch.tensor([0, *channels]).cumsum(0).tolist()
    spans = [slice(bounds[i], bounds[i + 1]) for i in range(count)]

    inputs = random_values((batch, time, total), dtype)
    if coeffs_layout == "per_element":
        coeffs = make_coeffs((batch, time, total), dtype, log_coeffs)
        wide_coeffs = coeffs
    elif coeffs_layout == "per_channel":
        coeffs = make_coeffs((total,), dtype, log_coeffs)
        wide_coeffs = coeffs.expand(inputs.shape)
    else:  # one per (batch, time) and case, shared by the case's channels
        coeffs = make_coeffs((batch, time, count), dtype, log_coeffs)
        wide_coeffs = coeffs.repeat_interleave(torch.tensor(channels), dim=2)
    initial = random_values((batch, total), dtype) if with_initial else None
    d_outputs = random_values((batch, time, total), dtype)

    def case_coeffs(i):
        if coeffs_layout == "per_element":
            return coeffs[:, :, spans[i]].contiguous()
        if coeffs_layout == "per_channel":
            return coeffs[spans[i]].contiguous()
        return coeffs[:, :, i : i + 1].contiguous()

    options = dict(dim=1, reverse=reverse, log_coeffs=log_coeffs)
    actual, labels, shapes = [], [], []
    for i, n in enumerate(channels):
        case = (inputs[:, :, spans[i]].contiguous(), case_coeffs(i),
                None if initial is None else initial[:, spans[i]].contiguous(), d_outputs[:, :, spans[i]].contiguous())
        assert case[0].is_contiguous() and case[0].shape == (batch, time, n)
        actual.append(run_kernels(*case, **options))
        labels.append(f"shape={(batch, time, n)} coeffs={tuple(case[1].shape)} reverse={reverse} "
                      f"initial={with_initial} log_coeffs={log_coeffs}")
        shapes.append(case[1].shape)

    results = reference_results(inputs, wide_coeffs, initial, d_outputs, **options)
    expected = [[], []]
    for which, (outputs, d_inputs, d_coeffs, *d_initial) in enumerate(results):
        for i in range(count):
            case = [outputs[:, :, spans[i]], d_inputs[:, :, spans[i]], summed(d_coeffs[:, :, spans[i]], shapes[i])]
            expected[which].append(case + [d_initial[0][:, spans[i]]] if with_initial else case)
    assert_cases_match(dtype, labels, actual, *expected)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("coeffs_layout", CHANNEL_COEFFS)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_channel_contiguous_every_channel_count_matches_reference(seed, dtype, coeffs_layout, reverse):
    """Contiguous (batch, time, C) inputs scanned along dim 1, every C in 1..70 (each remainder of every
    vector width and of groups of vectors), batch 1 or 2 and time 1, 2, 7 or 33, with and without an
    initial state and log coefficients: outputs and every gradient match the float64 loop reference."""
    for batch, time in BATCH_TIME:
        for with_initial, log_coeffs in VARIANTS:
            check_channels_every_count(dtype, batch, time, coeffs_layout, reverse, with_initial, log_coeffs)


# ---------------------------------------------------------------------------------------------------
# 2, 3. Long sequences across block and thread boundaries; bitwise equal for every thread count.

#: (rows, length): just under and over 2^16, 3 * 2^15 + 17 (a partial last block for every power-of-two
#: block length up to 2^16) and just over 2^17.
LONG_ROWS = [(1, 2**16 - 1), (3, 2**16 + 1), (1, 3 * 2**15 + 17), (2, 2**17 + 5)]
LONG_DTYPES = [torch.float32, torch.bfloat16]


def test_associative_scan_reference_matches_loop_reference(seed):
    """The float64 associative-scan recurrence the long-sequence tests compare with gives the loop's
    outputs and gradients, over an initial state, packed sequences and both directions."""
    inputs = random_values((2, 2100), torch.float64)
    coeffs = make_coeffs((2, 2100), torch.float64, min_magnitude=0.5)
    d_outputs = random_values((2, 2100), torch.float64)
    for reverse in (False, True):
        initial = random_values((2,), torch.float64)
        hop = reference_results(inputs, coeffs, initial, d_outputs, linrec_hop, reverse=reverse)
        loop = reference_results(inputs, coeffs, initial, d_outputs, linrec_loop, reverse=reverse)
        assert_cases_match(torch.float64, ["values", "magnitudes"], list(hop), list(loop), [loop[1]] * 2)
        offsets = torch.tensor([0, 700, 701, 2100])
        initial = random_values((3,), torch.float64)
        packed = (inputs[:1], coeffs[:1], initial, d_outputs[:1])
        hop = reference_results(*packed, linrec_hop, reverse=reverse, cu_seqlens=offsets)
        loop = reference_results(*packed, linrec_loop, reverse=reverse, cu_seqlens=offsets)
        assert_cases_match(torch.float64, ["packed values", "packed magnitudes"], list(hop), list(loop), [loop[1]] * 2)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", LONG_DTYPES, ids=str)
@pytest.mark.parametrize("rows, length", LONG_ROWS, ids=str)
def test_long_rows_match_reference_bitwise_equal_for_every_thread_count(seed, rows, length, dtype,
                                                                        reverse):
    """Contiguous rows longer than any block, scanned from an initial state with |c| in (0.5, 1): outputs
    and every gradient are bitwise equal under 1, 2, 3, 5 and 8 threads and match the float64
    reference."""
    shape = (rows, length)
    check_every_thread_count(
        dtype, f"shape={shape} reverse={reverse}", random_values(shape, dtype),
        make_coeffs(shape, dtype, min_magnitude=0.5), random_values((rows,), dtype), random_values(shape, dtype),
        reverse=reverse)


#: Packed sequences along one row, one of them as long as each of LONG_ROWS' lengths.
LONG_PACKINGS = [[5, 2**16 - 1, 0, 3 * 2**15 + 17, 1], [2**17 + 5, 700, 2**16 + 1]]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", LONG_DTYPES, ids=str)
@pytest.mark.parametrize("lengths", LONG_PACKINGS, ids=str)
def test_long_packed_sequences_match_reference_bitwise_equal_for_every_thread_count(seed, lengths,
                                                                                    dtype, reverse):
    """A (1, L) row packing a few sequences (cu_seqlens, int64) of which some cross the long lengths'
    block boundaries, each from its own initial state: outputs and every gradient bitwise equal under
    every thread count, and equal to the float64 reference."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    shape = (1, sum(lengths))
    check_every_thread_count(
        dtype, f"lengths={lengths} reverse={reverse}", random_values(shape, dtype),
        make_coeffs(shape, dtype, min_magnitude=0.5), random_values((len(lengths),), dtype),
        random_values(shape, dtype), reverse=reverse, cu_seqlens=offsets)


def test_channels_layout_bitwise_equal_for_every_thread_count(seed):
    """(4, 4096, 256) float32 along dim 1 from an initial state: outputs and every gradient bitwise
    equal under every thread count, and equal to the float64 reference (one direction: the reference
    alone takes over a second here)."""
    shape = (4, 4096, 256)
    check_every_thread_count(
        torch.float32, f"shape={shape} dim=1", random_values(shape, torch.float32),
        make_coeffs(shape, torch.float32, min_magnitude=0.5), random_values((4, 256), torch.float32),
        random_values(shape, torch.float32), dim=1)


@pytest.mark.parametrize("reverse", [False, True])
def test_longest_single_row_bitwise_equal_for_every_thread_count(seed, reverse):
    """One (1, 2^18 + 3) float32 row from an initial state, the case most worth splitting across threads:
    outputs and every gradient bitwise equal under every thread count, and equal to the float64
    reference."""
    shape = (1, 2**18 + 3)
    check_every_thread_count(
        torch.float32, f"shape={shape} reverse={reverse}", random_values(shape, torch.float32),
        make_coeffs(shape, torch.float32, min_magnitude=0.5), random_values((1,), torch.float32),
        random_values(shape, torch.float32), reverse=reverse)


# ---------------------------------------------------------------------------------------------------
# 4. Many short packed sequences.

#: Empty sequences (first and last too), single steps, every remainder around vector widths, and some
#: longer than 64 steps; shuffled per test, with an empty one kept at each end.
SHORT_LENGTHS = [0, 0, 1, 1, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129]


@pytest.mark.parametrize("log_coeffs", [False, True])
@pytest.mark.parametrize("with_initial", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("layout", ["time_last", "channels"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_many_short_packed_sequences_match_reference(seed, dtype, layout, reverse, with_initial, log_coeffs):
    """cu_seqlens (int32) packing ~24 sequences of lengths 0..129 in random order along (1, L) time last
    or (1, L, 19) along dim 1: outputs and every gradient match the float64 loop reference."""
    middle = [SHORT_LENGTHS[i] for i in torch.randperm(len(SHORT_LENGTHS)).tolist()]
    lengths = [0, *middle, 0]
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    total = sum(lengths)
    shape, dim = ((1, total), -1) if layout == "time_last" else ((1, total, 19), 1)
    initial = None
    if with_initial:
        initial = random_values((len(lengths),) if layout == "time_last" else (len(lengths), 19), dtype)
    check_one(dtype, f"lengths={lengths} shape={shape}", random_values(shape, dtype),
              make_coeffs(shape, dtype, log_coeffs), initial, random_values(shape, dtype),
              dim=dim, reverse=reverse, cu_seqlens=offsets, log_coeffs=log_coeffs)


# ---------------------------------------------------------------------------------------------------
# 5. A non-finite first coefficient takes no part without an initial state.

NONFINITE_LENGTHS = [1, 15, 16, 17, 33]


def poison_first_steps(coeffs, dim, firsts, log_coeffs):
    """coeffs with +inf, -inf (not as log: exp(-inf) = 0 is finite) and NaN in turn (over the elements)
    at time indices `firsts` along `dim`; returns them and the mask of what was replaced."""
    values = [float("inf"), float("nan")] if log_coeffs else [float("inf"), float("-inf"), float("nan")]
    poisoned = coeffs.clone()
    mask = torch.zeros(coeffs.shape, dtype=torch.bool)
    for first in firsts:
        where = mask.narrow(dim, first, 1)
        where.fill_(True)
        pattern = torch.tensor(values, dtype=coeffs.dtype)[torch.arange(where.numel()) % len(values)]
        poisoned.narrow(dim, first, 1).copy_(pattern.reshape(where.shape))
    return poisoned, mask


NONFINITE_LAYOUTS = {  # layout: (inputs shape for a length, coeffs shape, dim)
    "rows": (lambda n: (19, n), lambda n: (19, n), -1),
    "rows_per_step_coeffs": (lambda n: (3, n), lambda n: (n,), -1),
    "channels": (lambda n: (2, n, 19), lambda n: (2, n, 19), 1),
    "channels_per_batch_time_coeffs": (lambda n: (2, n, 5), lambda n: (2, n, 1), 1),
}


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", NONFINITE_LENGTHS)
@pytest.mark.parametrize("layout", NONFINITE_LAYOUTS)
def test_nonfinite_first_coefficient_takes_no_part(seed, layout, length, reverse):
    """Without an initial state, inf, -inf or NaN coefficients at the first step of the scan (the last
    index with reverse), also as log coefficients, reach neither the outputs nor the gradients: all
    finite, equal to the float64 loop reference with finite coefficients there, and the poisoned
    coefficients' gradients exactly 0. In every dtype, on time-contiguous rows and the channel layout."""
    input_shape, coeff_shape, dim = NONFINITE_LAYOUTS[layout]
    first = length - 1 if reverse else 0
    for dtype in KERNEL_DTYPES:
        for log_coeffs in (False, True):
            inputs = random_values(input_shape(length), dtype)
            finite = make_coeffs(coeff_shape(length), dtype, log_coeffs)
            coeffs, mask = poison_first_steps(finite, dim, [first], log_coeffs)
            assert not torch.isfinite(coeffs[mask]).any()
            d_outputs = random_values(inputs.shape, dtype)
            options = dict(dim=dim, reverse=reverse, log_coeffs=log_coeffs)
            actual = run_kernels(inputs, coeffs, None, d_outputs, **options)
            label = f"{layout} {dtype} shape={tuple(inputs.shape)} coeffs={tuple(coeffs.shape)} {options}"
            assert (actual[2][mask] == 0).all(), f"{label}: poisoned coefficients' gradients {actual[2][mask]}"
            if not log_coeffs:  # the reference itself never reads them
                assert torch.isfinite(linrec_reference(linrec_loop, wide(inputs), wide(coeffs), **options)).all()
            check_one(dtype, label, inputs, finite, None, d_outputs, actual=actual, **options)


#: Packings of sequences of 1, 15, 16, 17 and 33 steps: time last, the first runs on the rows kernels (70
#: steps beside them make 16 or more on average), the second on the plain recurrence (fewer).
NONFINITE_PACKINGS = [[16, 1, 33, 15, 17, 1, 70], [16, 1, 33, 15, 17, 1]]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("lengths", NONFINITE_PACKINGS, ids=str)
@pytest.mark.parametrize("layout", ["time_last", "channels"])
def test_nonfinite_first_coefficients_of_packed_sequences_take_no_part(seed, layout, lengths, reverse):
    """cu_seqlens packing sequences of lengths 1, 15, 16, 17 and 33, each with a non-finite coefficient at
    its first step, no initial state: outputs and gradients finite and equal to the reference with
    finite coefficients there, and those coefficients' gradients exactly 0."""
    bounds = torch.tensor([0, *lengths]).cumsum(0)
    offsets = bounds.to(torch.int32)
    firsts = (bounds[1:] - 1 if reverse else bounds[:-1]).tolist()
    shape, dim = ((1, sum(lengths)), -1) if layout == "time_last" else ((1, sum(lengths), 19), 1)
    for dtype in KERNEL_DTYPES:
        inputs = random_values(shape, dtype)
        finite = make_coeffs(shape, dtype)
        coeffs, mask = poison_first_steps(finite, dim, firsts, False)
        d_outputs = random_values(shape, dtype)
        options = dict(dim=dim, reverse=reverse, cu_seqlens=offsets)
        actual = run_kernels(inputs, coeffs, None, d_outputs, **options)
        label = f"{layout} lengths={lengths} dtype={dtype} reverse={reverse}"
        assert (actual[2][mask] == 0).all(), f"{label}: poisoned coefficients' gradients {actual[2][mask]}"
        check_one(dtype, label, inputs, finite, None, d_outputs, actual=actual, **options)


# ---------------------------------------------------------------------------------------------------
# 6. Every instruction set the kernels are compiled for, on this machine.

@pytest.mark.parametrize("value, message", [
    ("sse9", "LINREC_CPU_ISA must be baseline, avx2 or avx512, got 'sse9'"),
    ("AVX2", "LINREC_CPU_ISA must be baseline, avx2 or avx512, got 'AVX2'"),
])
def test_unknown_instruction_set_is_refused(monkeypatch, value, message):
    """A LINREC_CPU_ISA the kernels do not know is an error naming the variable and the choices, not
    a silent run on some other instruction set."""
    monkeypatch.setenv("LINREC_CPU_ISA", value)
    with pytest.raises(ValueError, match=re.escape(message)):
        linrec.linrec(random_values((2, 5), torch.float32), random_values((2, 5), torch.float32))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
def test_every_instruction_set_matches_reference(seed, monkeypatch, isa):
    """The vector kernels compiled for AVX-512, AVX2 and the baseline (SSE2 or NEON), chosen per call
    through LINREC_CPU_ISA (sets the CPU lacks are skipped): every lane remainder of both vector
    layouts matches the float64 reference, and a row split across threads is bitwise equal for every
    thread count."""
    use_instruction_set(monkeypatch, isa)
    for dtype in (torch.float32, torch.bfloat16):
        for reverse in (False, True):
            check_rows_every_length(dtype, 3, "per_element", reverse, True, False)
            check_rows_every_length(dtype, 1, "per_row", reverse, False, True)
            check_channels_every_count(dtype, 2, 7, "per_element", reverse, True, True)
    shape = (1, 2**17 + 5)
    check_every_thread_count(
        torch.float32, f"isa={isa} shape={shape}", random_values(shape, torch.float32),
        make_coeffs(shape, torch.float32, min_magnitude=0.5), random_values((1,), torch.float32),
        random_values(shape, torch.float32))
