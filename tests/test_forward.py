"""Forward pass of the compiled kernels against the float64 loop reference."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import DTYPES, assert_matches, random_operands, reference

import linrec

# Odd and boundary lengths, several leading dims, empty sequences and empty batches.
SHAPES = [(1,), (2,), (31,), (3, 33), (2, 3, 1000), (5, 4, 1), (4, 2, 2), (0, 7), (3, 0), (2, 4097)]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_reference(device, seed, shape, dtype, reverse):
    inputs, coeffs = random_operands(shape, dtype, device)
    outputs = linrec.linrec(inputs, coeffs, reverse=reverse)
    assert outputs.dtype == dtype and outputs.device == inputs.device
    assert_matches(outputs, reference(inputs, coeffs, reverse=reverse), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_random_shapes(device, seed, dtype):
    """Fresh leading dims and odd lengths on every run."""
    for _ in range(3):
        shape = [random.randint(1, 5) for _ in range(random.randint(0, 2))] + [2 * random.randint(0, 700) + 1]
        reverse = random.random() < 0.5
        inputs, coeffs = random_operands(shape, dtype, device)
        assert_matches(linrec.linrec(inputs, coeffs, reverse=reverse), reference(inputs, coeffs, reverse=reverse), dtype)


def test_many_sequences_spread_over_threads(device, seed):
    inputs, coeffs = random_operands((4099, 17), torch.float32, device)
    assert_matches(linrec.linrec(inputs, coeffs), reference(inputs, coeffs), torch.float32)


@pytest.mark.parametrize("dim", [0, 1, -2])
@pytest.mark.parametrize("reverse", [False, True])
def test_any_dim_and_strided_inputs(device, seed, dim, reverse):
    inputs = random_operands((37, 6, 5), torch.float32, device)[0].transpose(1, 2)  # non-contiguous views
    coeffs = random_operands((37, 5, 12), torch.float32, device)[1][..., ::2]
    assert not inputs.is_contiguous() and not coeffs.is_contiguous()
    outputs = linrec.linrec(inputs, coeffs, dim=dim, reverse=reverse)
    assert_matches(outputs, reference(inputs, coeffs, dim=dim, reverse=reverse), torch.float32)


def test_first_coefficient_takes_no_part(device):
    inputs = torch.tensor([2.0, 3.0, 5.0], device=device)
    for first in (float("nan"), float("inf"), 0.0, 7.0):
        coeffs = torch.tensor([first, 0.5, -2.0], device=device)
        assert linrec.linrec(inputs, coeffs).tolist() == [2.0, 4.0, -3.0]
        # reverse: the last element is the first one scanned; 5, 0.5*5 + 3 = 5.5, -2*5.5 + 2 = -9
        reversed_coeffs = torch.tensor([-2.0, 0.5, first], device=device)
        assert linrec.linrec(inputs, reversed_coeffs, reverse=True).tolist() == [-9.0, 5.5, 5.0]


def test_worked_example(device):
    inputs = torch.tensor([[1.0, 2.0, 3.0, 4.0]], device=device)
    coeffs = torch.tensor([[9.0, 0.5, 2.0, -1.0]], device=device)
    # 1, 0.5*1 + 2 = 2.5, 2*2.5 + 3 = 8, -8 + 4 = -4
    assert linrec.linrec(inputs, coeffs).tolist() == [[1.0, 2.5, 8.0, -4.0]]
    # reverse: 4, 2*4 + 3 = 11, 0.5*11 + 2 = 7.5, 9*7.5 + 1 = 68.5
    assert linrec.linrec(inputs, coeffs, reverse=True).tolist() == [[68.5, 7.5, 11.0, 4.0]]


@pytest.mark.parametrize("reverse", [False, True])
def test_nan_and_inf_propagate_like_the_recurrence(device, seed, reverse):
    inputs, coeffs = random_operands((3, 50), torch.float64, device)
    inputs[0, 20] = float("nan")
    inputs[1, 10] = float("inf")
    coeffs[2, 30] = float("inf")
    outputs = linrec.linrec(inputs, coeffs, reverse=reverse).cpu()
    expected = reference(inputs, coeffs, reverse=reverse)
    finite = torch.isfinite(expected)
    # Where the recurrence stays finite, the values match; NaN stays NaN. Past an infinity the
    # recurrence gives +-Inf, which a parallel scan may combine into Inf - Inf = NaN: non-finite
    # either way, never a finite value.
    torch.testing.assert_close(outputs[finite], expected[finite], rtol=1e-12, atol=1e-12)
    assert torch.isnan(outputs[torch.isnan(expected)]).all()
    assert not torch.isfinite(outputs[~finite]).any()
    assert (~finite).sum() > 3 * 10  # every row has non-finite outputs after its infinity or NaN
def test_meta_tensors_give_shapes_only():
    inputs = torch.empty(3, 8, device="meta")
    assert linrec.linrec(inputs, torch.empty_like(inputs), dim=0).shape == (3, 8)


@pytest.mark.cuda
def test_cuda_side_stream(seed):
    if not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS):
        pytest.skip("needs a CUDA GPU and linrec's CUDA kernels")
    inputs, coeffs = random_operands((64, 999), torch.float32, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        outputs = linrec.linrec(inputs * 2, coeffs)  # the multiply and the scan both on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    assert_matches(outputs, reference(inputs * 2, coeffs), torch.float32)



def test_poisoning_is_active():
    assert torch.isnan(torch.empty(16)).all()


@pytest.mark.parametrize("reverse", [False, True])
def test_long_sequences_over_many_tiles(device, seed, reverse):
    inputs, coeffs = random_operands((2, 65537), torch.float32, device, requires_grad=True)
    outputs = linrec.linrec(inputs, coeffs, reverse=reverse)
    assert_matches(outputs, reference(inputs, coeffs, reverse=reverse), torch.float32)
