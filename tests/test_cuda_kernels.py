"""The CUDA kernels config by config: every compiled tile shape, lengths around its tile boundary,
aligned and unaligned rows, sequences split across blocks (chained) around every chunk boundary, time
strided, and the sizes where offsets need 64 bits. The references are the CPU kernels in float64
(checked against the loop recurrence and autograd in test_forward/test_backward)."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    DTYPES,
    TOLERANCE,
    assert_matches,
    check_with_features,
    misaligned_copy,
    packed_offsets,
    poison_free_memory,
    random_coeffs,
    random_operands,
    random_values,
    wide,
)

import linrec
from linrec.tools.tune import CHAINED_TILE_SHAPE, TILE_SHAPES

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS), reason="needs a CUDA GPU"),
]

# Strided time runs on the bulk family (sm_90 and newer, channels contiguous and 16-byte aligned) or
# on the pipe family's strided kernels; a forced tile shape keeps a call on the pipe family, so the
# strided tests run both on GPUs that have the bulk family.
STRIDED_FAMILIES = [pytest.param((0, 0), id="automatic")]
if TILE_SHAPES:  # a build without CUDA kernels lists none (and skips these tests)
    STRIDED_FAMILIES.append(pytest.param(TILE_SHAPES[-2], id="pipe"))


def cpu_reference(inputs, coeffs, d_outputs, reverse):
    """Forward outputs and (d_inputs, d_coeffs) in float64 on the CPU."""
    inputs, coeffs, d_outputs = (wide(t) for t in (inputs, coeffs, d_outputs))
    outputs = torch.ops.linrec.forward(inputs, coeffs, reverse=reverse)
    return (outputs, *torch.ops.linrec.backward(d_outputs, coeffs, outputs, reverse=reverse)[:2])


def accumulator_size(dtype):
    """Bytes of the type the kernels compute in: float32 for the 16-bit types."""
    return max(torch.empty((), dtype=dtype).element_size(), 4)


def tile_length(config, dtype):
    """Elements of a tile: 16-byte vectors of the dtype, or of the accumulator for the chained kernels."""
    threads, vectors = config
    vector_bytes = accumulator_size(dtype) if config == CHAINED_TILE_SHAPE else torch.empty((), dtype=dtype).element_size()
    return threads * vectors * 16 // vector_bytes


def strided_tile_length(dtype, paired=False):
    """Time steps of a strided tile: kStridedTileShape, 8 warps x 4 accumulator vectors a thread. 16-bit
    types piped along time scan two neighbouring channels a thread (8-byte accumulators) where the layout
    allows it (paired): an even channel count with channels contiguous in every operand."""
    return 8 * 4 * 16 // (8 if paired else accumulator_size(dtype))


def check_config(shape, dtype, reverse, config, misaligned=False):
    inputs, coeffs = random_operands(shape, dtype, "cuda")
    d_outputs = random_values(shape, dtype, "cuda")
    if misaligned:
        inputs, coeffs, d_outputs = map(misaligned_copy, (inputs, coeffs, d_outputs))
    expected_outputs, expected_d_inputs, expected_d_coeffs = cpu_reference(inputs, coeffs, d_outputs, reverse)
    poison_free_memory(inputs.numel(), dtype)
    outputs = torch.ops.linrec.forward(inputs, coeffs, -1, reverse, None, None, False, *config)
    assert_matches(outputs, expected_outputs, dtype, f"outputs {config}")
    poison_free_memory(inputs.numel(), dtype)
    d_inputs, d_coeffs, _ = torch.ops.linrec.backward(d_outputs, coeffs, outputs, -1, reverse, None, None, False, *config)
    assert_matches(d_inputs, expected_d_inputs, dtype, f"d_inputs {config}")
    assert_matches(d_coeffs, expected_d_coeffs, dtype, f"d_coeffs {config}")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", TILE_SHAPES, ids=str)
def test_every_compiled_config(seed, config, dtype, reverse):
    tile = tile_length(config, dtype)
    for length in sorted({1, 2, tile - 1, tile, tile + 1, 3 * tile + 5, 3 * tile + 8}):
        if length > 0:
            check_config((37, length), dtype, reverse, config)
    check_config((5, 2 * tile), dtype, reverse, config, misaligned=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
@pytest.mark.parametrize("config", TILE_SHAPES, ids=str)
def test_every_config_with_initial_and_broadcast_coeffs(seed, config, dtype, reverse):
    """The pipe kernels' branches for an initial state, coefficients broadcast along time (one per row)
    and log coefficients, around the tile boundary, against the CPU kernels in float64 (complex128)."""
    threads, vectors = config
    tile = tile_length(config, dtype)
    for length in (tile - 1, tile + 1, 2 * tile):
        inputs = random_values((37, length), dtype, "cuda")
        # |c| <= 0.9: one coefficient for a whole row near 1 would carry float32 rounding over the
        # full length (error ~ length * eps), past a tolerance meant for recurrences that forget.
        coeffs = random_coeffs((37, 1), dtype, "cuda") * 0.9
        if not dtype.is_complex:
            coeffs = coeffs.abs().log()  # exercise log_coeffs too
        initial = random_values((37,), dtype, "cuda")
        d_outputs = random_values((37, length), dtype, "cuda")
        options = dict(dim=-1, reverse=reverse, initial=initial, log_coeffs=not dtype.is_complex)
        forced = dict(threads_per_sequence=threads, vectors_per_thread=vectors)
        outputs = torch.ops.linrec.forward(inputs, coeffs, **options, **forced)
        grads = torch.ops.linrec.backward(d_outputs, coeffs, outputs, **options, **forced)
        wide_options = dict(options, initial=wide(initial))
        expected_outputs = torch.ops.linrec.forward(wide(inputs), wide(coeffs), **wide_options)
        expected = torch.ops.linrec.backward(wide(d_outputs), wide(coeffs), expected_outputs, **wide_options)
        assert_matches(outputs, expected_outputs, dtype, f"outputs {config} L={length}")
        for name, grad, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads, expected):
            assert_matches(grad, want, dtype, f"{name} {config} L={length}")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape, dim", [((3, 1000, 67), 1), ((2, 70000, 5), 1), ((1, 33, 4097), 1)], ids=str)
def test_strided_time_dim_at_size(seed, shape, dim, reverse):
    """Time in the middle dim (the strided kernels), long and wide, with an initial state."""
    inputs, coeffs = random_operands(shape, torch.float32, "cuda")
    initial = random_values((shape[0], shape[2]), torch.float32, "cuda")
    d_outputs = random_values(shape, torch.float32, "cuda")
    options = dict(dim=dim, reverse=reverse, initial=initial)
    outputs = torch.ops.linrec.forward(inputs, coeffs, **options)
    grads = torch.ops.linrec.backward(d_outputs, coeffs, outputs, **options)
    wide_options = dict(options, initial=wide(initial))
    expected_outputs = torch.ops.linrec.forward(wide(inputs), wide(coeffs), **wide_options)
    expected = torch.ops.linrec.backward(wide(d_outputs), wide(coeffs), expected_outputs, **wide_options)
    assert_matches(outputs, expected_outputs, torch.float32)
    for name, grad, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads, expected):
        assert_matches(grad, want, torch.float32, name)


@pytest.mark.parametrize("family", STRIDED_FAMILIES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_strided_time_channel_pairs(seed, dtype, reverse, family):
    """16-bit types piped along strided time, two neighbouring channels a thread: lengths around the
    paired tile, per-channel log coefficients (broadcast along batch and time, their gradient summed in
    the kernel in pairs), and the layouts that keep one channel a thread (an odd channel count, a start
    one element past alignment, channels with stride 2)."""
    tile = strided_tile_length(dtype, paired=True)
    channels = 17000  # 532 groups of 32: enough to pipe, and 266 of pairs
    for length in (1, tile - 1, tile, tile + 1, 2 * tile + 8, 5 * tile + 1):
        inputs, coeffs = random_operands((1, length, channels), dtype, "cuda")
        check_with_features(inputs, coeffs, 1, reverse, config=family)
    inputs = random_values((1, 2 * tile + 5, channels), dtype, "cuda")
    coeffs = (random_coeffs((channels,), dtype, "cuda") * 0.9).abs().log()
    check_with_features(inputs, coeffs, 1, reverse, log_coeffs=True, config=family)
    odd = random_operands((1, 2 * tile + 1, channels + 1), dtype, "cuda")
    misaligned = [misaligned_copy(t) for t in random_operands((1, 2 * tile + 1, channels), dtype, "cuda")]
    every_other = [t[..., ::2] for t in random_operands((1, 2 * tile + 1, 2 * channels), dtype, "cuda")]
    for inputs, coeffs in (odd, misaligned, every_other):
        check_with_features(inputs, coeffs, 1, reverse, config=family)


# (inputs shape, dim, coeffs shape): each way the backward kernels sum a broadcast coefficient's
# gradient. Along time within a thread, then across a sequence's lanes (time-contiguous segments) or
# warps (strided time), then across a warp's sequences where they share the coefficient; or, with
# coefficients that vary along time, a warp's sum per step, or an addition per element.
SUMMED_BROADCASTS = [
    ((16, 300, 1024), 1, (1024,)),  # per channel, strided pipes (16-bit: channel pairs)
    ((16, 300, 1024), 1, ()),  # a scalar: every lane of every warp shares it
    ((16, 300, 1024), 1, (16, 300, 1)),  # per (batch, time), shared by a warp's channels
    ((2, 5000, 64), 1, (64,)),  # per channel, chained along time
    ((2, 5000, 64), 1, (2, 5000, 1)),  # per (batch, time), chained
    ((2, 5000, 48), 1, (2, 5000, 1)),  # a warp across two batch rows: added per element
    ((600, 64, 300), -1, (64, 1)),  # per channel, time last: 64-thread segments (two warps)
    ((5, 2000, 37), 1, (2000, 1)),  # per time step, shared across batch and channels
    ((3, 70001), -1, (3, 1)),  # one per row of few long rows (a lane per row)
    ((4, 8, 2000), -1, (4, 1, 2000)),  # per (batch, time), time last: added per element
]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
@pytest.mark.parametrize("shape, dim, coeffs_shape", SUMMED_BROADCASTS, ids=str)
def test_broadcast_coeff_gradient_summed_in_kernel(seed, shape, dim, coeffs_shape, dtype, reverse):
    """The gradient of broadcast coefficients, in coeffs' shape from the kernels, against the CPU
    kernels' per-element gradient summed in float64; the error measured against the sum of the terms'
    magnitudes (the sum itself cancels towards 0 under random upstream gradients)."""
    inputs = random_values(shape, dtype, "cuda")
    coeffs = random_coeffs(coeffs_shape, dtype, "cuda") * 0.9
    d_outputs = random_values(shape, dtype, "cuda")
    outputs = torch.ops.linrec.forward(inputs, coeffs, dim, reverse)
    poison_free_memory(inputs.numel(), dtype)
    d_inputs, d_coeffs, _ = torch.ops.linrec.backward(d_outputs, coeffs, outputs, dim, reverse)
    assert d_coeffs.shape == coeffs.shape and d_coeffs.dtype == dtype
    expected_outputs = torch.ops.linrec.forward(wide(inputs), wide(coeffs), dim, reverse)
    full_coeffs = wide(coeffs).expand(shape)
    expected_d_inputs, terms, _ = torch.ops.linrec.backward(wide(d_outputs), full_coeffs, expected_outputs, dim, reverse)
    assert_matches(d_inputs, expected_d_inputs, dtype, "d_inputs")
    expected = terms.sum_to_size(coeffs.shape)
    actual = d_coeffs.cpu().to(expected.dtype)
    assert torch.isfinite(actual).all(), "d_coeffs: non-finite elements"
    scale = terms.abs().sum_to_size(coeffs.shape).max().clamp_min(1e-30)
    error = ((actual - expected).abs().max() / scale).item()
    assert error <= TOLERANCE[dtype], f"d_coeffs: max error / sum |terms| = {error:.3g} > {TOLERANCE[dtype]:.3g}"


def chunk_boundary_lengths(tile):
    """Lengths around the first chunk boundaries and past one look-back window of 32 chunks: odd ones
    (unaligned rows, the staged kernels) and multiples of 8 that are not whole chunks (16-byte aligned
    rows in every dtype, the coalesced or vectorized kernels, with a partial last chunk)."""
    return [tile - 1, tile, tile + 1, tile + 8, 2 * tile + 1, 2 * tile + 8, 33 * tile - 1, 33 * tile + 1, 33 * tile + 8]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_few_long_rows_chained(seed, dtype, reverse):
    """Two time-contiguous rows: each split into one-tile chunks scanned by different blocks."""
    tile = tile_length(CHAINED_TILE_SHAPE, dtype)
    for length in chunk_boundary_lengths(tile):
        inputs, coeffs = random_operands((2, length), dtype, "cuda")
        check_with_features(inputs, coeffs, -1, reverse)


@pytest.mark.parametrize("family", STRIDED_FAMILIES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_time_chained_and_piped(seed, dtype, reverse, family):
    """(batch, time, channels) along dim=1: a warp's lanes on neighbouring channels; 40 channels are a
    full and a partial group of 32, chained along time; 9000 channels are enough groups for a pipe each."""
    tile = strided_tile_length(dtype)
    for length in chunk_boundary_lengths(tile):
        inputs, coeffs = random_operands((1, length, 40), dtype, "cuda")
        check_with_features(inputs, coeffs, 1, reverse, config=family)
    inputs, coeffs = random_operands((2, tile + 1, 4500), dtype, "cuda")
    check_with_features(inputs, coeffs, 1, reverse, config=family)


@pytest.mark.parametrize("family", STRIDED_FAMILIES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chained_look_back_across_windows(seed, dtype, reverse, family):
    """Coefficients of magnitude near 1: no chunk's map is constant (with |c| < 1 at random, a chunk's
    product of coefficients underflows to 0, and the look-back stops at the chunk before), so the
    look-back composes more than one window of chunks: a chunk's siblings and the maps of the windows
    before (lookback.h). Rows and strided time."""
    row_tile, strided_tile = tile_length(CHAINED_TILE_SHAPE, dtype), strided_tile_length(dtype)
    for shape, dim in [((2, 33 * row_tile + 1), -1), ((2, 33 * row_tile + 8), -1), ((1, 33 * strided_tile + 1, 40), 1)]:
        inputs = random_values(shape, dtype, "cuda")
        coeffs = random_coeffs(shape, dtype, "cuda", min_magnitude=0.99)
        check_with_features(inputs, coeffs, dim, reverse, config=family)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_chained_blocks_take_many_chunks(seed, dtype, reverse):
    """More chunks than chained blocks fit on the GPU at once (a few hundred on an H100): blocks that
    start as others finish, look-backs onto finished chunks; aligned rows (coalesced in float32 and
    float64, vectorized in bfloat16) with a partial last chunk and whole-chunk rows; 2100 chunks make
    three levels of maps (lookback.h). Coefficients near 1, so that the look-back climbs them all."""
    tile = tile_length(CHAINED_TILE_SHAPE, dtype)
    for shape in [(3, 700 * tile + 8), (1, 2100 * tile)]:
        inputs = random_values(shape, dtype, "cuda")
        coeffs = random_coeffs(shape, dtype, "cuda", min_magnitude=0.99)
        check_with_features(inputs, coeffs, -1, reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
def test_split_paths_with_broadcast_and_log_coeffs(seed, dtype, reverse):
    """Coefficients broadcast along time on few long rows (one per row), and across channels (one per
    (batch, time), Mamba-2), with log coefficients for real types."""
    log_coeffs = not dtype.is_complex
    cases = [((3, 70001), -1, (3, 1)), ((2, 3001, 40), 1, (2, 3001, 1))]
    for shape, dim, coeffs_shape in cases:
        inputs = random_values(shape, dtype, "cuda")
        coeffs = random_coeffs(coeffs_shape, dtype, "cuda") * 0.9  # see the note in the test above
        if log_coeffs:
            coeffs = coeffs.abs().log()
        check_with_features(inputs, coeffs, dim, reverse, log_coeffs)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [1, 2, 31, 33, 1000, 65537, 2**20 + 1])
def test_lengths_with_the_automatic_config(seed, length, reverse):
    check_config((3, length), torch.float32, reverse, (0, 0))


def test_rejects_configs_that_are_not_compiled():
    inputs, coeffs = random_operands((4, 64), torch.float32, "cuda")
    with pytest.raises(ValueError, match=r"no kernel is compiled for config \{threads_per_sequence=3, vectors_per_thread=1"):
        torch.ops.linrec.forward(inputs, coeffs, threads_per_sequence=3, vectors_per_thread=1)
    with pytest.raises(ValueError, match=r"threads_per_sequence and vectors_per_thread must both be 0"):
        torch.ops.linrec.forward(inputs, coeffs, threads_per_sequence=32, vectors_per_thread=0)


def test_more_than_2_to_the_31_elements(seed):
    """Offsets past 2**31 elements: the last rows start beyond what 32-bit indices reach."""
    length = 2**20 + 1
    sequences = 2**31 // length + 2
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    inputs = torch.randn(sequences, length, dtype=torch.bfloat16, device="cuda")
    coeffs = torch.rand(sequences, length, dtype=torch.bfloat16, device="cuda")
    assert inputs.numel() > 2**31
    outputs = torch.ops.linrec.forward(inputs, coeffs, reverse=True)
    d_inputs, d_coeffs, _ = torch.ops.linrec.backward(inputs, coeffs, outputs, reverse=True)
    for result in (outputs, d_inputs, d_coeffs):
        assert torch.isfinite(result).all()  # every element written (outputs start as NaN)
    rows = [0, sequences - 2, sequences - 1]
    expected = cpu_reference(inputs[rows], coeffs[rows], inputs[rows], True)
    for name, actual, reference in zip(("outputs", "d_inputs", "d_coeffs"), (outputs, d_inputs, d_coeffs), expected):
        assert_matches(actual[rows], reference, torch.bfloat16, name)


def check_packed(inputs, coeffs, dim, reverse, offsets, config=(0, 0), with_initial=True, log_coeffs=False):
    """Forward and backward over packed sequences, on poisoned memory, against the CPU kernels in float64."""
    check_with_features(inputs, coeffs, dim, reverse, log_coeffs, offsets, config, with_initial)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.complex64], ids=str)
@pytest.mark.parametrize("config", TILE_SHAPES, ids=str)
def test_packed_sequences_every_config(seed, config, dtype, reverse):
    """Sequence starts at every position around chunk and tile boundaries (and chained chunks), empty
    sequences and sequences of one element, in every compiled config of time-contiguous rows, with
    and without initial states."""
    tile = tile_length(config, dtype)
    items = tile // config[0]
    for length, with_initial in ((3 * tile + 5, True), (2 * tile + 8, False)):
        inputs, coeffs = random_operands((1, 37, length), dtype, "cuda")
        check_packed(inputs, coeffs, 2, reverse, packed_offsets(length, tile, items), config, with_initial)


@pytest.mark.parametrize("family", STRIDED_FAMILIES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
def test_packed_sequences_strided_time(seed, dtype, reverse, family):
    """(1, time, channels) along dim 1: sequence starts around every chunk and tile boundary of the
    strided kernels, chained along time (40 channels) and piped (9000 channels)."""
    tile = strided_tile_length(dtype)
    items = tile // 8
    for length, channels in ((3 * tile + 5, 40), (33 * tile + 1, 40), (2 * tile + 3, 9000)):
        inputs, coeffs = random_operands((1, length, channels), dtype, "cuda")
        check_packed(inputs, coeffs, 1, reverse, packed_offsets(length, tile, items), family)
    inputs, coeffs = random_operands((1, 2 * tile + 3, 40), dtype, "cuda")
    check_packed(inputs, coeffs, 1, reverse, packed_offsets(2 * tile + 3, tile, items), family, with_initial=False)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_sequences_broadcast_and_log_coeffs(seed, dtype, reverse):
    """Log coefficients broadcast along time (one per row: the broadcast kernels) and across channels
    (one per (batch, time), strided time) over packed sequences."""
    tile = tile_length(TILE_SHAPES[-2], dtype)
    cases = [((1, 37, 3 * tile + 5), 2, (1, 37, 1), tile, tile // 64), ((1, 3001, 40), 1, (1, 3001, 1), 128, 16)]
    for shape, dim, coeffs_shape, edge_tile, items in cases:
        inputs = random_values(shape, dtype, "cuda")
        coeffs = (random_coeffs(coeffs_shape, dtype, "cuda") * 0.9).abs().log()
        check_packed(inputs, coeffs, dim, reverse, packed_offsets(shape[dim], edge_tile, items), log_coeffs=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_sequences_many_and_long(seed, dtype, reverse):
    """Many sequences of random lengths (empty ones included) with the automatic config, time last
    and strided; one sequence (the unpacked call's result); and few long rows chained across blocks
    with coefficients near 1, so that look-backs walk across sequence starts."""
    generator = torch.Generator().manual_seed(0)
    for count, length in ((4096, 20011), (1, 5000)):
        cuts = torch.randint(0, length + 1, (count - 1,), generator=generator).sort().values
        offsets = torch.cat([torch.tensor([0]), cuts, torch.tensor([length])]).to(torch.int64)
        for shape, dim in (((1, 3, length), 2), ((1, length, 8), 1)):
            inputs, coeffs = random_operands(shape, dtype, "cuda")
            check_packed(inputs, coeffs, dim, reverse, offsets)
    tile = tile_length(CHAINED_TILE_SHAPE, dtype)
    length = 40 * tile + 8
    offsets = torch.tensor([0, 1, 5 * tile, 5 * tile, 5 * tile + 1, 37 * tile - 1, length], dtype=torch.int32)
    inputs = random_values((1, 2, length), dtype, "cuda")
    coeffs = random_coeffs((1, 2, length), dtype, "cuda", min_magnitude=0.99)
    check_packed(inputs, coeffs, 2, reverse, offsets)
