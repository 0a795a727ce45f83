"""Every differentiation path: forward-mode AD (jvp), double and triple backward, torch.func transforms
and torch.vmap, against finite differences (gradcheck, gradgradcheck) and the float64 loop reference,
over the features the ops take."""

from __future__ import annotations

import pytest
import torch
from helpers import TOLERANCE, assert_matches, random_coeffs, random_values, wide
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap

import linrec

DTYPES = [torch.float64, torch.complex128]


def _operands(dtype, device, shape, coeffs_shape=None, initial_shape=None, log_coeffs=False):
    inputs = random_values(shape, dtype, device, requires_grad=True)
    coeffs = random_coeffs(shape if coeffs_shape is None else coeffs_shape, dtype, device, min_magnitude=0.2)
    if log_coeffs:
        coeffs = -coeffs.abs()  # log c of c in (0.37, 0.82]
    tensors = [inputs, coeffs.requires_grad_()]
    if initial_shape is not None:
        tensors.append(random_values(initial_shape, dtype, device, requires_grad=True))
    return tensors


def _packed(device):
    return torch.tensor([0, 3, 3, 7, 8], device=device)  # an empty sequence, one of length 1


#: name -> (dtype, device) -> (tensors: inputs, coeffs[, initial], keyword arguments of linrec.linrec)
CASES = {
    "time_last": lambda dtype, device: (_operands(dtype, device, (2, 7)), {}),
    "time_middle_initial": lambda dtype, device: (_operands(dtype, device, (2, 5, 3), None, (2, 3)), dict(dim=1)),
    "strided_time_first": lambda dtype, device: (
        [t.detach().t().requires_grad_() for t in _operands(dtype, device, (3, 6))], dict(dim=0)),
    "coeffs_per_channel": lambda dtype, device: (_operands(dtype, device, (2, 5, 3), (3,), (2, 3)), dict(dim=1)),
    "coeffs_per_step": lambda dtype, device: (_operands(dtype, device, (2, 5, 3), (2, 5, 1)), dict(dim=1)),
    "coeffs_scalar": lambda dtype, device: (_operands(dtype, device, (2, 5), ()), {}),
    "length_1_initial": lambda dtype, device: (_operands(dtype, device, (3, 1), None, (3,)), {}),
    "log_coeffs_initial": lambda dtype, device: (
        _operands(dtype, device, (2, 6), None, (2,), log_coeffs=True), dict(log_coeffs=True)),
    "log_coeffs_broadcast": lambda dtype, device: (
        _operands(dtype, device, (2, 6, 2), (2, 1, 2), (2, 2), log_coeffs=True), dict(dim=1, log_coeffs=True)),
    "packed_initial": lambda dtype, device: (
        _operands(dtype, device, (1, 8, 2), None, (4, 2)), dict(dim=1, cu_seqlens=_packed(device))),
    "packed": lambda dtype, device: (_operands(dtype, device, (1, 8, 2)), dict(dim=1, cu_seqlens=_packed(device))),
    "packed_log_coeffs": lambda dtype, device: (
        _operands(dtype, device, (1, 8, 2), (8, 1), (4, 2), log_coeffs=True),
        dict(dim=1, cu_seqlens=_packed(device), log_coeffs=True)),
}


def _case(name, dtype, device, reverse=False):
    if dtype.is_complex and "log_coeffs" in name:
        pytest.skip("log_coeffs takes real coefficients")
    tensors, kwargs = CASES[name](dtype, device)
    return tensors, dict(kwargs, reverse=reverse)


def _recurrence(kwargs, backend="auto"):
    """linrec over (inputs, coeffs[, initial]) as positional tensors."""
    def run(inputs, coeffs, initial=None):
        return linrec.linrec(inputs, coeffs, initial=initial, backend=backend, **kwargs)
    return run


def every_case(test):
    """Parametrizes a test over every case, both dtypes and both directions."""
    test = pytest.mark.parametrize("reverse", [False, True])(test)
    test = pytest.mark.parametrize("dtype", DTYPES, ids=str)(test)
    return pytest.mark.parametrize("case", CASES)(test)


@every_case
def test_gradcheck_reverse_and_forward_mode(device, seed, case, dtype, reverse):
    tensors, kwargs = _case(case, dtype, device, reverse)
    assert torch.autograd.gradcheck(
        _recurrence(kwargs), tensors, check_forward_ad=True, check_batched_grad=True,
        check_batched_forward_grad=True, check_undefined_grad=True,
    )


@every_case
def test_gradgradcheck(device, seed, case, dtype, reverse):
    tensors, kwargs = _case(case, dtype, device, reverse)
    assert torch.autograd.gradgradcheck(
        _recurrence(kwargs), tensors, check_fwd_over_rev=True, check_rev_over_rev=True, check_batched_grad=True
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["time_middle_initial", "packed_initial", "log_coeffs_broadcast"])
def test_third_derivatives(device, seed, case, dtype):
    tensors, kwargs = _case(case, dtype, device, reverse=True)
    recurrence = _recurrence(kwargs)

    def gradients(*tensors):
        loss = (recurrence(*tensors).abs() ** 2).sum()
        return torch.autograd.grad(loss, tensors, create_graph=True)

    assert torch.autograd.gradgradcheck(gradients, tensors)


def test_jvp_matches_finite_differences_and_reference(device, seed):
    inputs, coeffs, initial = _operands(torch.float64, device, (2, 9, 3), None, (2, 3))
    primals = (inputs.detach(), coeffs.detach(), initial.detach())
    tangents = tuple(torch.randn_like(t) for t in primals)
    recurrence = _recurrence(dict(dim=1))
    _, tangent = jvp(recurrence, primals, tangents)
    _, expected = jvp(_recurrence(dict(dim=1), backend="loop"), primals, tangents)
    step = 1e-6
    plus = recurrence(*(p + step * t for p, t in zip(primals, tangents)))
    minus = recurrence(*(p - step * t for p, t in zip(primals, tangents)))
    assert_matches(tangent, expected.cpu(), torch.float64, "jvp")
    torch.testing.assert_close(tangent, (plus - minus) / (2 * step), rtol=1e-6, atol=1e-6)


def test_forward_ad_dual_tensors_on_the_op(device, seed):
    """The op called directly carries tangents too (a custom op would otherwise drop them silently)."""
    import torch.autograd.forward_ad as forward_ad

    inputs, coeffs = (t.detach() for t in _operands(torch.float64, device, (3, 11)))
    t_inputs, t_coeffs = torch.randn_like(inputs), torch.randn_like(coeffs)
    with forward_ad.dual_level():
        outputs = torch.ops.linrec.forward(forward_ad.make_dual(inputs, t_inputs), forward_ad.make_dual(coeffs, t_coeffs))
        tangent = forward_ad.unpack_dual(outputs).tangent
    _, expected = jvp(_recurrence({}, backend="loop"), (inputs, coeffs), (t_inputs, t_coeffs))
    assert tangent is not None
    assert_matches(tangent, expected.cpu(), torch.float64, "tangent")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["time_middle_initial", "coeffs_per_channel", "packed_initial", "log_coeffs_broadcast"])
def test_gradient_penalty_matches_reference(device, seed, case, dtype):
    """Double backward as a training step uses it: a penalty on the input gradients, then backward."""
    tensors, kwargs = _case(case, dtype, device, reverse=True)
    d_outputs = random_values(tensors[0].shape, dtype, device)

    def penalized_gradients(backend):
        outputs = _recurrence(kwargs, backend)(*tensors)
        first = torch.autograd.grad(outputs, tensors, d_outputs, create_graph=True)
        penalty = sum((g.abs() ** 2).sum() for g in first) + (outputs.abs() ** 2).sum()
        return torch.autograd.grad(penalty, tensors)

    for actual, expected, name in zip(penalized_gradients("auto"), penalized_gradients("loop"), ("x", "c", "h")):
        assert_matches(actual, expected.detach().cpu(), dtype, f"d penalty / d {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_jvp_and_gradient_penalty_in_training_dtypes(device, seed, dtype):
    """The formulas in the dtypes models train in, against the float64 loop from the same rounded values."""
    shape = (2, 67, 5)
    tensors = [random_values(shape, dtype, device, True), random_coeffs(shape, dtype, device, True),
               random_values((2, 5), dtype, device, True)]
    d_outputs, *tangents = (random_values(t.shape, dtype, device) for t in [tensors[0], *tensors])
    recurrence, loop = _recurrence(dict(dim=1)), _recurrence(dict(dim=1), "loop")

    def penalty_gradients(recurrence, tensors, d_outputs):
        first = torch.autograd.grad(recurrence(*tensors), tensors, d_outputs, create_graph=True)
        return torch.autograd.grad(sum((g.float() ** 2).sum() for g in first), tensors)

    expected = penalty_gradients(loop, [wide(t).requires_grad_() for t in tensors], wide(d_outputs))
    for actual, reference, name in zip(penalty_gradients(recurrence, tensors, d_outputs), expected, ("x", "c", "h")):
        # More rounded stages than one op's outputs (forward, backward, their derivatives): twice the
        # tolerance of one (at most 0.73 of one seen over 30 seeds).
        error = ((actual.detach().cpu().double() - reference).abs().max() / reference.abs().max()).item()
        assert error <= 2 * TOLERANCE[dtype], f"d penalty / d {name}: {error:.3g} ({dtype})"
    _, tangent = jvp(recurrence, tuple(t.detach() for t in tensors), tuple(tangents))
    _, expected_tangent = jvp(loop, tuple(wide(t) for t in tensors), tuple(wide(t) for t in tangents))
    assert_matches(tangent, expected_tangent, dtype, "jvp")


def _loss(kwargs, backend):
    recurrence = _recurrence(kwargs, backend)
    return lambda *tensors: (recurrence(*tensors).abs() ** 2).sum()


TRANSFORMS = {
    "grad": lambda f, n: grad(f, argnums=tuple(range(n))),
    "jacrev": lambda f, n: jacrev(f, argnums=tuple(range(n))),
    "jacfwd": lambda f, n: jacfwd(f, argnums=tuple(range(n))),
    "hessian": lambda f, n: hessian(f, argnums=tuple(range(n))),
    "jacrev_of_jacrev": lambda f, n: jacrev(jacrev(f, argnums=1)),
    "jacrev_of_jacfwd": lambda f, n: jacrev(jacfwd(f, argnums=1)),
    "jvp_of_grad": lambda f, n: (lambda *t: jvp(grad(f, argnums=1), t, tuple(torch.ones_like(x) for x in t))[1]),
    "grad_of_grad": lambda f, n: grad(lambda *t: grad(f, argnums=1)(*t).abs().sum(), argnums=tuple(range(n))),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("case", ["time_middle_initial", "coeffs_per_step", "packed_initial", "log_coeffs_initial"])
def test_torch_func_transforms_match_reference(device, seed, case, transform):
    tensors, kwargs = _case(case, torch.float64, device, reverse=True)
    tensors = [t.detach() for t in tensors]
    make = TRANSFORMS[transform]
    actual = make(_loss(kwargs, "auto"), len(tensors))(*tensors)
    expected = make(_loss(kwargs, "loop"), len(tensors))(*tensors)
    for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
        assert_matches(a, e.cpu(), torch.float64, transform)


@pytest.mark.parametrize("in_dims", [(0, None, None), (None, 1, None), (None, None, 0), (2, 0, 1)], ids=str)
@pytest.mark.parametrize("case", ["time_middle_initial", "coeffs_per_channel", "packed_initial"])
def test_vmap_matches_a_loop_over_samples(device, seed, case, in_dims):
    tensors, kwargs = _case(case, torch.float64, device)
    batched = [
        t.detach() if d is None else torch.stack([torch.randn_like(t.detach()) for _ in range(3)], dim=d)
        for t, d in zip(tensors, in_dims)
    ]
    recurrence = _recurrence(kwargs)
    actual = vmap(recurrence, in_dims=in_dims)(*batched)
    for sample in range(3):
        args = [t if d is None else t.select(d, sample) for t, d in zip(batched, in_dims)]
        assert_matches(actual[sample], _recurrence(kwargs, "loop")(*args).cpu(), torch.float64, f"sample {sample}")


def test_per_sample_gradients_with_vmap_of_grad(device, seed):
    inputs, coeffs, initial = (t.detach() for t in _operands(torch.float64, device, (4, 6, 3), (3,), (4, 3)))

    def loss(backend):
        return lambda x, c, h: (linrec.linrec(x, c, dim=0, initial=h, backend=backend) ** 2).sum()  # (time, channels)

    per_sample = vmap(grad(loss("auto"), argnums=(1, 2)), in_dims=(0, None, 0))(inputs, coeffs, initial)
    expected = vmap(grad(loss("loop"), argnums=(1, 2)), in_dims=(0, None, 0))(inputs, coeffs, initial)
    for a, e in zip(per_sample, expected):
        assert_matches(a, e.cpu(), torch.float64, "per-sample gradient")


def test_forward_mode_nested_in_forward_mode_is_refused(device, seed):
    inputs, coeffs = (t.detach() for t in _operands(torch.float64, device, (2, 5)))
    with pytest.raises(NotImplementedError, match="linrec: forward-mode AD nested in forward-mode AD"):
        jacfwd(jacfwd(lambda c: linrec.linrec(inputs, c)))(coeffs)


def test_vmap_over_cu_seqlens_is_refused(device, seed):
    inputs, coeffs = (t.detach() for t in _operands(torch.float64, device, (1, 8, 2)))
    offsets = torch.stack([_packed(device), _packed(device)])
    with pytest.raises(ValueError, match="linrec: torch.vmap over cu_seqlens is not supported"):
        vmap(lambda cu: linrec.linrec(inputs, coeffs, dim=1, cu_seqlens=cu))(offsets)
    with pytest.raises(ValueError, match="linrec.forward: torch.vmap over cu_seqlens is not supported"):
        vmap(lambda cu: torch.ops.linrec.forward(inputs, coeffs, 1, False, None, cu))(offsets)
