"""torch.library.opcheck on every op, references against each other, and torch.compile."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, assert_matches, random_operands, reference

import linrec


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, so earlier tests' cache entries count against no recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def forward_samples(device):
    for dtype in DTYPES:
        for shape, reverse in (((3, 17), False), ((2, 2, 5), True), ((1,), False), ((4, 0), True)):
            inputs, coeffs = random_operands(shape, dtype, device, requires_grad=dtype.is_floating_point)
            yield inputs, coeffs, reverse
    inputs, coeffs = random_operands((6, 9), torch.float32, device)
    yield inputs.t(), coeffs.t(), False  # non-contiguous


@pytest.mark.parametrize("reverse", [False, True])
def test_opcheck_forward(device, seed, reverse):
    for inputs, coeffs, sample_reverse in forward_samples(device):
        torch.library.opcheck(torch.ops.linrec.forward.default, (inputs, coeffs, reverse != sample_reverse))


def test_opcheck_backward(device, seed):
    for inputs, coeffs, reverse in forward_samples(device):
        outputs = linrec.linrec(inputs.detach(), coeffs.detach(), reverse=reverse)
        d_outputs = torch.randn_like(outputs)
        torch.library.opcheck(torch.ops.linrec.backward.default, (d_outputs, coeffs.detach(), outputs, reverse))


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


def test_compile_dynamic_shapes_without_recompiling(device, seed):
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda x, c: linrec.linrec(x, c, reverse=True), fullgraph=True, backend=counter, dynamic=True)
    for shape in ((3, 17), (5, 40), (2, 101)):
        inputs, coeffs = random_operands(shape, torch.float32, device)
        assert_matches(compiled(inputs, coeffs), reference(inputs, coeffs, reverse=True), torch.float32)
    assert counter.frame_count == 1
