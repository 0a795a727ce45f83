"""The bulk family (csrc/include/linrec/bulk/): a strided time dim with contiguous channels, on sm_90
and newer. Persistent blocks scan chunks of 32 channels x 128 steps (64 for complex64) that the copy
unit brings into a ring in shared memory, several chunks ahead, with the carry looked back at across a
channel tile's chunks. Checked on poisoned memory against the CPU kernels in float64: lengths around
the chunk boundary and past the ring and the grid, channel tiles with remainders, every feature,
non-finite values, and the layouts the copy unit cannot address, which take the pipe family."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    check_with_features,
    linrec_loop,
    misaligned_copy,
    packed_offsets,
    random_coeffs,
    random_operands,
    random_values,
    reference,
)

import linrec

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (HOPPER and linrec.HAS_CUDA_KERNELS), reason="needs an sm_90 or newer GPU"),
]

BULK_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.complex64]


def chunk_length(dtype):
    """Steps of a chunk: 4 warps x 32 steps a thread, 16 for 8-byte states (complex64)."""
    return 4 * (16 if dtype.is_complex else 32)


def kernels_launched(run):
    """The names of the CUDA kernels `run()` launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        run()
        torch.cuda.synchronize()
    return {event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA}


def families_of(inputs, coeffs, **options):
    """Which family ran the forward and the backward op of a call: {'bulk'}, {'pipe'} or both."""
    def run():
        outputs = torch.ops.linrec.forward(inputs, coeffs, **options)
        torch.ops.linrec.backward(torch.ones_like(outputs), coeffs, outputs, **options)

    scans = [name for name in kernels_launched(run) if "_forward_kernel" in name or "_backward_kernel" in name]
    assert len(scans) == 2, scans
    return {"bulk" if "bulk_" in name else "pipe" for name in scans}


@pytest.mark.parametrize("dtype", BULK_DTYPES, ids=str)
def test_strided_time_takes_the_bulk_family(seed, dtype):
    """Aligned (batch, time, channels) along dim 1 runs the bulk kernels, forward and backward; the
    layouts the copy unit cannot address, and a forced tile shape, run the pipe family."""
    inputs, coeffs = random_operands((2, 300, 64), dtype, "cuda")
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    assert families_of(inputs, coeffs, dim=1, threads_per_sequence=64, vectors_per_thread=2) == {"pipe"}
    misaligned = [misaligned_copy(t) for t in (inputs, coeffs)]
    assert families_of(*misaligned, dim=1) == {"pipe"}
    odd = random_operands((2, 300, 63), dtype, "cuda")  # a time stride of 63 elements: not whole 16 bytes
    assert families_of(*odd, dim=1) == {"pipe"}
    strided_channels = [t[..., ::2] for t in random_operands((2, 300, 128), dtype, "cuda")]
    assert families_of(*strided_channels, dim=1) == {"pipe"}


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", BULK_DTYPES, ids=str)
def test_lengths_around_chunks_and_the_ring(seed, dtype, reverse):
    """Lengths around the chunk boundary, a full and a partial channel tile (40 channels), and enough
    chunks that every block takes several and the ring wraps (2 to 4 stages), with coefficients near 1
    so that the look-back climbs past the window of 32 chunks."""
    chunk = chunk_length(dtype)
    for length in (2, chunk - 1, chunk, chunk + 1, 2 * chunk + 8, 5 * chunk + 3):
        inputs, coeffs = random_operands((1, length, 40), dtype, "cuda")
        check_with_features(inputs, coeffs, 1, reverse)
    inputs = random_values((3, 40 * chunk + 5, 96), dtype, "cuda")
    coeffs = random_coeffs(inputs.shape, dtype, "cuda", min_magnitude=0.99)
    check_with_features(inputs, coeffs, 1, reverse)


@pytest.mark.parametrize("dtype", BULK_DTYPES, ids=str)
def test_many_chunks_per_block(seed, dtype):
    """Thousands of chunks over the persistent grid, few channel tiles (32): each block takes dozens,
    by block index, and looks back onto chunks of blocks that are further along or behind."""
    chunk = chunk_length(dtype)
    inputs = random_values((1, 300 * chunk + 17, 1024), dtype, "cuda")
    coeffs = random_coeffs(inputs.shape, dtype, "cuda", min_magnitude=0.9)
    check_with_features(inputs, coeffs, 1, False)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_chunks_taken_from_a_counter(seed, dtype, reverse):
    """As many channel tiles as a GPU holds blocks (16 x 1024 channels: 512 tiles): the blocks take
    their chunks from a counter, several each, and look back onto chunks that other blocks took."""
    chunk = chunk_length(dtype)
    inputs = random_values((16, 6 * chunk + 3, 1024), dtype, "cuda")
    coeffs = random_coeffs(inputs.shape, dtype, "cuda", min_magnitude=0.9)
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    check_with_features(inputs, coeffs, 1, reverse)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_channel_tiles_and_strides(seed, dtype):
    """Channel counts that leave a partial tile of 32; views of the first channels of wider rows (the
    inputs' time stride differs from the outputs'), in whole 16-byte pieces (the bulk family) or not
    (the pipe family); batch strides that skip rows."""
    for channels in (8, 24, 72, 1000):
        inputs, coeffs = random_operands((2, 333, channels), dtype, "cuda")
        check_with_features(inputs, coeffs, 1, True)
    for kept, family in ((8, "bulk"), (40, "bulk"), (13, "pipe")):
        inputs, coeffs = (t[..., :kept] for t in random_operands((2, 333, 64), dtype, "cuda"))
        assert families_of(inputs, coeffs, dim=1) == {family}
        check_with_features(inputs, coeffs, 1, False)
    inputs, coeffs = (t[::2] for t in random_operands((6, 301, 48), dtype, "cuda"))
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    check_with_features(inputs, coeffs, 1, False)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_float32_coefficients_beside_16_bit_inputs(seed, dtype, reverse):
    """Mixed precision: 16-bit inputs with float32 coefficients and initial states (their own boxes,
    twice as wide), plain and as logs."""
    inputs = random_values((2, 3 * chunk_length(dtype) + 7, 72), dtype, "cuda")
    coeffs = random_coeffs(inputs.shape, torch.float32, "cuda")
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    check_with_features(inputs, coeffs, 1, reverse)
    log_coeffs = (coeffs.abs() * 0.9 + 0.05).log()
    check_with_features(inputs, log_coeffs, 1, reverse, log_coeffs=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_log_coefficients(seed, dtype, reverse):
    inputs = random_values((2, 4 * chunk_length(dtype) + 1, 40), dtype, "cuda")
    coeffs = (random_coeffs(inputs.shape, dtype, "cuda") * 0.9).abs().log()
    check_with_features(inputs, coeffs, 1, reverse, log_coeffs=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", BULK_DTYPES, ids=str)
def test_packed_sequences(seed, dtype, reverse):
    """Sequence starts at, before and after every chunk and thread boundary, empty sequences and
    sequences of one step, with and without initial states."""
    chunk = chunk_length(dtype)
    items = chunk // 8
    for length, with_initial in ((3 * chunk + 5, True), (2 * chunk + 8, False)):
        inputs, coeffs = random_operands((1, length, 40), dtype, "cuda")
        assert families_of(inputs, coeffs, dim=1, cu_seqlens=packed_offsets(length, chunk, items).cuda()) == {"bulk"}
        check_with_features(inputs, coeffs, 1, reverse, offsets=packed_offsets(length, chunk, items),
                            with_initial=with_initial)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_finite_values_follow_the_recurrence(seed, dtype, reverse):
    """NaN and +-Inf in inputs and coefficients, on and beside chunk boundaries: the rows that hold
    them get the loop's non-finite values (NaN where it has NaN, its infinities with their signs), and
    every other value matches the reference."""
    chunk = chunk_length(dtype)
    inputs = random_values((2, 6 * chunk + 3, 64), dtype, "cuda")
    coeffs = random_coeffs(inputs.shape, dtype, "cuda")
    inputs[0, chunk - 1, 3] = float("nan")
    inputs[1, 2 * chunk, 40] = float("inf")
    inputs[1, 3 * chunk + 1, 41] = float("-inf")
    coeffs[0, 4 * chunk, 63] = float("inf")
    coeffs[1, chunk + 5, 0] = float("nan")
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    outputs = linrec.linrec(inputs, coeffs, dim=1, reverse=reverse).cpu().double()
    expected = reference(inputs.cpu(), coeffs.cpu(), dim=1, reverse=reverse)
    finite = torch.isfinite(expected)
    assert (~finite).sum() > 4 * chunk
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(outputs[finite], expected[finite], rtol=tolerance, atol=tolerance)
    assert torch.isnan(outputs[torch.isnan(expected)]).all()
    infinite = torch.isinf(expected)
    assert torch.equal(outputs[infinite], expected[infinite])


@pytest.mark.parametrize("reverse", [False, True])
def test_exact_zeros_ones_and_overflow_follow_the_loop(seed, reverse):
    """float32 coefficients exactly 0 (resets inside a chunk and on a chunk boundary), exactly 1 (running
    sums across every chunk) and 1e10 (the state overflows to +-Inf within a few steps, where the
    parallel products become Inf and NaN): the outputs are the float32 loop's, its non-finite values
    exactly."""
    chunk = chunk_length(torch.float32)
    inputs = random_values((2, 3 * chunk + 5, 64), torch.float32, "cuda")
    coeffs = random_coeffs(inputs.shape, torch.float32, "cuda")
    coeffs[:, chunk, :8] = 0.0
    coeffs[:, chunk // 2 + 3, 8:16] = 0.0
    coeffs[:, :, 16:24] = 1.0
    coeffs[0, :, 24] = 1e10
    assert families_of(inputs, coeffs, dim=1) == {"bulk"}
    outputs = linrec.linrec(inputs, coeffs, dim=1, reverse=reverse).cpu()
    expected = linrec_loop(inputs.cpu().transpose(1, 2), coeffs.cpu().transpose(1, 2), reverse).transpose(1, 2)
    finite = torch.isfinite(expected)
    assert (~finite).sum() > 2 * chunk  # channel 24 of row 0 from its overflow on
    scale = expected[finite].abs().max().item()
    torch.testing.assert_close(outputs[finite], expected[finite], rtol=1e-4, atol=1e-4 * scale)
    assert torch.isnan(outputs[torch.isnan(expected)]).all()
    infinite = torch.isinf(expected)
    assert torch.equal(outputs[infinite], expected[infinite])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_captured_in_a_cuda_graph(seed, dtype):
    """The cooperative launch captured in a CUDA graph (as torch.compile's reduce-overhead mode
    captures it): replays over new values in the same tensors give the bits of direct calls, with chunks
    taken by block (2 x 8 channel tiles) and, in bfloat16, from the counter (16 x 32; float32 with that
    many tiles takes the pipe family)."""
    for shape in ((2, 999, 256), (16, 777, 1024)):
        inputs, coeffs = random_operands(shape, dtype, "cuda")
        d_outputs = random_values(shape, dtype, "cuda")
        if dtype == torch.bfloat16 or shape[2] == 256:
            assert families_of(inputs, coeffs, dim=1) == {"bulk"}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the first call's one-time setup, outside the capture
            torch.ops.linrec.backward(d_outputs, coeffs, torch.ops.linrec.forward(inputs, coeffs, dim=1), dim=1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = torch.ops.linrec.forward(inputs, coeffs, dim=1)
            grads = torch.ops.linrec.backward(d_outputs, coeffs, outputs, dim=1)
        for _ in range(2):
            new_inputs, new_coeffs = random_operands(shape, dtype, "cuda")
            inputs.copy_(new_inputs)
            coeffs.copy_(new_coeffs)
            graph.replay()
            expected = torch.ops.linrec.forward(new_inputs, new_coeffs, dim=1)
            expected_grads = torch.ops.linrec.backward(d_outputs, new_coeffs, expected, dim=1)
            assert torch.equal(outputs, expected)
            for grad, want in zip(grads, expected_grads):
                assert (grad is None and want is None) or torch.equal(grad, want)
