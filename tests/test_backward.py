"""Gradients: the backward op against autograd through the float64 loop, gradcheck, and the zero
gradient of the first coefficient."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, assert_matches, random_operands, random_values, reference_gradients

import linrec
from linrec import linrec_loop


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (2,), (31,), (3, 33), (2, 3, 257), (4, 1), (0, 5), (2, 0)], ids=str)
def test_backward_matches_reference(device, seed, shape, dtype, reverse):
    inputs, coeffs = random_operands(shape, dtype, device, requires_grad=True)
    d_outputs = random_values(shape, dtype, device)
    outputs = linrec.linrec(inputs, coeffs, reverse=reverse)
    d_inputs, d_coeffs = torch.autograd.grad(outputs, (inputs, coeffs), d_outputs)
    expected_d_inputs, expected_d_coeffs = reference_gradients(d_outputs, inputs, coeffs, -1, reverse)
    assert_matches(d_inputs, expected_d_inputs, dtype, "d_inputs")
    assert_matches(d_coeffs, expected_d_coeffs, dtype, "d_coeffs")


@pytest.mark.parametrize("reverse", [False, True])
def test_backward_along_middle_dim_with_broadcast_gradient(device, seed, reverse):
    inputs, coeffs = random_operands((3, 101, 4), torch.float32, device, requires_grad=True)
    # .sum() hands the backward an expanded (stride-0) gradient
    linrec.linrec(inputs, coeffs, dim=1, reverse=reverse).sum().backward()
    expected = reference_gradients(torch.ones(3, 101, 4), inputs, coeffs, 1, reverse)
    assert_matches(inputs.grad, expected[0], torch.float32, "d_inputs")
    assert_matches(coeffs.grad, expected[1], torch.float32, "d_coeffs")


@pytest.mark.parametrize("reverse", [False, True])
def test_only_the_needed_gradient(device, seed, reverse):
    inputs, coeffs = random_operands((2, 40), torch.float32, device)
    coeffs.requires_grad_()
    (d_coeffs,) = torch.autograd.grad(linrec.linrec(inputs, coeffs, reverse=reverse).sum(), coeffs)
    assert_matches(d_coeffs, reference_gradients(torch.ones(2, 40), inputs, coeffs, -1, reverse)[1], torch.float32)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_gradcheck(device, seed, dtype, reverse):
    inputs, coeffs = random_operands((3, 2, 13), dtype, device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, c: linrec.linrec(x, c, dim=1, reverse=reverse), (inputs, coeffs))
    assert torch.autograd.gradcheck(lambda x, c: linrec.linrec(x, c, reverse=reverse), (inputs, coeffs))


def test_first_coefficient_gets_zero_gradient(device):
    inputs = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    coeffs = torch.tensor([float("inf"), 0.5, 2.0], device=device, requires_grad=True)
    linrec.linrec(inputs, coeffs).sum().backward()
    # y = [1, 2.5, 8]; d_inputs = [1 + 0.5*(1 + 2), 1 + 2, 1] = [2.5, 3, 1]; d_coeffs = [0, 3*1, 1*2.5]
    assert inputs.grad.tolist() == [2.5, 3.0, 1.0]
    assert coeffs.grad.tolist() == [0.0, 3.0, 2.5]


@pytest.mark.parametrize("coeff_shape", [(3, 1), (1,), ()])
def test_empty_time_dim_gives_zero_coefficient_gradient(device, coeff_shape):
    """No step contributes to a coefficient that broadcasts along an empty time dim: its gradient is 0
    (d_coeffs, which has more elements than the outputs here, is allocated, not left unwritten)."""
    inputs = torch.randn(3, 0, device=device, requires_grad=True)
    coeffs = torch.rand(coeff_shape, device=device, requires_grad=True)
    initial = torch.randn(3, device=device, requires_grad=True)
    grads = torch.autograd.grad(linrec.linrec(inputs, coeffs, initial=initial).sum(), [inputs, coeffs, initial])
    assert grads[0].shape == (3, 0)
    assert grads[1].shape == coeff_shape and (grads[1] == 0).all()
    assert (grads[2] == 0).all()


def test_backward_op_directly(device, seed):
    d_outputs, coeffs = random_operands((5, 77), torch.float32, device)
    outputs = linrec.linrec(*random_operands((5, 77), torch.float32, device))
    d_inputs, d_coeffs, d_initial = torch.ops.linrec.backward(d_outputs, coeffs, outputs)
    assert d_initial.shape == (0,)  # no initial state
    # The seed's formula: a reverse scan of d_outputs with coefficients shifted by one, then a product
    # with outputs shifted the other way.
    shifted_coeffs = torch.cat([coeffs[:, 1:], torch.zeros_like(coeffs[:, :1])], dim=1)
    expected_d_inputs = linrec_loop(d_outputs.cpu().double(), shifted_coeffs.cpu().double(), reverse=True)
    shifted_outputs = torch.cat([torch.zeros_like(outputs[:, :1]), outputs[:, :-1]], dim=1)
    assert_matches(d_inputs, expected_d_inputs, torch.float32, "d_inputs")
    assert_matches(d_coeffs, expected_d_inputs * shifted_outputs.cpu().double(), torch.float32, "d_coeffs")
