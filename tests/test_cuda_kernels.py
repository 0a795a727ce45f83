"""The CUDA kernels config by config: every compiled tile shape, lengths around its tile boundary,
aligned and unaligned rows, and the sizes where offsets need 64 bits. The references are the CPU
kernels in float64 (checked against the loop recurrence and autograd in test_forward/test_backward)."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, assert_matches, random_operands

import linrec
from linrec.tune import TILE_SHAPES

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS), reason="needs a CUDA GPU"),
]


def cpu_reference(inputs, coeffs, d_outputs, reverse):
    """Forward outputs and (d_inputs, d_coeffs) in float64 on the CPU."""
    inputs, coeffs, d_outputs = (t.detach().cpu().double() for t in (inputs, coeffs, d_outputs))
    outputs = torch.ops.linrec.forward(inputs, coeffs, reverse)
    return (outputs, *torch.ops.linrec.backward(d_outputs, coeffs, outputs, reverse))


def misaligned_copy(tensor):
    """A contiguous copy whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    copy = storage[1:].view(tensor.shape)
    copy.copy_(tensor)
    return copy


def check_config(shape, dtype, reverse, config, misaligned=False):
    inputs, coeffs = random_operands(shape, dtype, "cuda")
    d_outputs = torch.randn(shape, dtype=torch.float64).to(dtype).cuda()
    if misaligned:
        inputs, coeffs, d_outputs = map(misaligned_copy, (inputs, coeffs, d_outputs))
    expected_outputs, expected_d_inputs, expected_d_coeffs = cpu_reference(inputs, coeffs, d_outputs, reverse)
    outputs = torch.ops.linrec.forward(inputs, coeffs, reverse, *config)
    assert_matches(outputs, expected_outputs, dtype, f"outputs {config}")
    d_inputs, d_coeffs = torch.ops.linrec.backward(d_outputs, coeffs, outputs, reverse, *config)
    assert_matches(d_inputs, expected_d_inputs, dtype, f"d_inputs {config}")
    assert_matches(d_coeffs, expected_d_coeffs, dtype, f"d_coeffs {config}")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", TILE_SHAPES, ids=str)
def test_every_compiled_config(seed, config, dtype, reverse):
    threads, vectors = config
    tile = threads * vectors * 16 // torch.empty((), dtype=dtype).element_size()
    for length in sorted({1, 2, tile - 1, tile, tile + 1, 3 * tile + 5}):
        if length > 0:
            check_config((37, length), dtype, reverse, config)
    check_config((5, 2 * tile), dtype, reverse, config, misaligned=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [1, 2, 31, 33, 1000, 65537, 2**20 + 1])
def test_lengths_with_the_automatic_config(seed, length, reverse):
    check_config((3, length), torch.float32, reverse, (0, 0))


def test_rejects_configs_that_are_not_compiled():
    inputs, coeffs = random_operands((4, 64), torch.float32, "cuda")
    with pytest.raises(ValueError, match=r"no kernel is compiled for config \{threads_per_sequence=3, vectors_per_thread=1"):
        torch.ops.linrec.forward(inputs, coeffs, False, 3, 1)
    with pytest.raises(ValueError, match=r"threads_per_sequence and vectors_per_thread must both be 0"):
        torch.ops.linrec.forward(inputs, coeffs, False, 32, 0)


def test_more_than_2_to_the_31_elements(seed):
    """Offsets past 2**31 elements: the last rows start beyond what 32-bit indices reach."""
    length = 2**20 + 1
    sequences = 2**31 // length + 2
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    inputs = torch.randn(sequences, length, dtype=torch.bfloat16, device="cuda")
    coeffs = torch.rand(sequences, length, dtype=torch.bfloat16, device="cuda")
    assert inputs.numel() > 2**31
    outputs = torch.ops.linrec.forward(inputs, coeffs, True)
    d_inputs, d_coeffs = torch.ops.linrec.backward(inputs, coeffs, outputs, True)
    for result in (outputs, d_inputs, d_coeffs):
        assert torch.isfinite(result).all()  # every element written (outputs start as NaN)
    rows = [0, sequences - 2, sequences - 1]
    expected = cpu_reference(inputs[rows], coeffs[rows], inputs[rows], True)
    for name, actual, reference in zip(("outputs", "d_inputs", "d_coeffs"), (outputs, d_inputs, d_coeffs), expected):
        assert_matches(actual[rows], reference, torch.bfloat16, name)
