"""torch.library.opcheck on every op, references against each other, and torch.compile."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, assert_matches, random_operands, random_values, reference

import linrec


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, so earlier tests' cache entries count against no recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def forward_samples(device):
    """(args, kwargs) of linrec.forward: every dtype, and every feature."""
    for dtype in DTYPES:
        for shape, reverse in (((3, 17), False), ((2, 2, 5), True), ((1,), False), ((4, 0), True)):
            inputs, coeffs = random_operands(shape, dtype, device, requires_grad=True)
            yield (inputs, coeffs), dict(reverse=reverse)
    inputs, coeffs = random_operands((6, 9), torch.float32, device, requires_grad=True)
    yield (inputs.t(), coeffs.t()), dict(dim=0)  # strided views, time first
    inputs, coeffs = random_operands((2, 9, 4), torch.float64, device, requires_grad=True)
    initial = random_values((2, 4), torch.float64, device, requires_grad=True)
    yield (inputs, coeffs[0, :, :1]), dict(dim=1, initial=initial, reverse=True)  # broadcast coeffs
    yield (inputs, -coeffs.abs()), dict(dim=1, log_coeffs=True)
    inputs, coeffs = random_operands((1, 12, 3), torch.complex64, device, requires_grad=True)
    initial = random_values((3, 3), torch.complex64, device, requires_grad=True)
    offsets = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
    yield (inputs, coeffs), dict(dim=1, initial=initial, cu_seqlens=offsets)


@pytest.mark.parametrize("reverse", [False, True])
def test_opcheck_forward(device, seed, reverse):
    for args, kwargs in forward_samples(device):
        kwargs = dict(kwargs, reverse=reverse != kwargs.get("reverse", False))
        torch.library.opcheck(torch.ops.linrec.forward.default, args, kwargs)


def test_opcheck_backward(device, seed):
    for (inputs, coeffs), kwargs in forward_samples(device):
        outputs = linrec.linrec(inputs.detach(), coeffs.detach(), **kwargs).detach()
        d_outputs = torch.randn_like(outputs)
        kwargs = {name: value.detach() if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
        torch.library.opcheck(torch.ops.linrec.backward.default, (d_outputs, coeffs.detach(), outputs), kwargs)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("backend", ["loop", "hop", "heinsen"])
def test_reference_backends_agree(device, seed, backend, reverse):
    inputs, coeffs = random_operands((3, 4, 45), torch.float64, device)
    coeffs = coeffs.abs() + 0.05  # Heinsen's log space needs nonzero coefficients
    outputs = linrec.linrec(inputs, coeffs, dim=1, reverse=reverse, backend=backend)
    assert_matches(outputs, reference(inputs, coeffs, dim=1, reverse=reverse), torch.float64)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, seed, backend, dynamic):
    def step(inputs, coeffs):
        hidden = linrec.linrec(torch.tanh(inputs), torch.sigmoid(coeffs), dim=1)
        return linrec.linrec(hidden, torch.sigmoid(coeffs), dim=1, reverse=True).square().mean()

    compiled = torch.compile(step, fullgraph=True, backend=backend, dynamic=dynamic)
    for length in (33, 50):
        inputs, coeffs = random_operands((2, length, 3), torch.float32, device, requires_grad=True)
        loss = compiled(inputs, coeffs)
        grads = torch.autograd.grad(loss, (inputs, coeffs))
        expected_loss = step(inputs, coeffs)
        expected_grads = torch.autograd.grad(expected_loss, (inputs, coeffs))
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
        for grad, expected in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_with_every_argument(device, seed, backend):
    def step(inputs, coeffs, initial, offsets):
        outputs = linrec.linrec(inputs, coeffs, dim=1, initial=initial, cu_seqlens=offsets, log_coeffs=True)
        return linrec.linrec(outputs, coeffs.exp(), dim=1, reverse=True).square().mean()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    inputs = random_values((1, 30, 4), torch.float32, device, requires_grad=True)
    coeffs = (-torch.rand(4, device=device)).requires_grad_()  # log of a per-channel decay
    initial = random_values((3, 4), torch.float32, device, requires_grad=True)
    offsets = torch.tensor([0, 7, 8, 30], device=device)
    loss = compiled(inputs, coeffs, initial, offsets)
    expected_loss = step(inputs, coeffs, initial, offsets)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(loss, (inputs, coeffs, initial))
    for grad, expected in zip(grads, torch.autograd.grad(expected_loss, (inputs, coeffs, initial))):
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)


def test_compile_dynamic_shapes_without_recompiling(device, seed):
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda x, c: linrec.linrec(x, c, reverse=True), fullgraph=True, backend=counter, dynamic=True)
    for shape in ((3, 17), (5, 40), (2, 101)):
        inputs, coeffs = random_operands(shape, torch.float32, device)
        assert_matches(compiled(inputs, coeffs), reference(inputs, coeffs, reverse=True), torch.float32)
    assert counter.frame_count == 1
