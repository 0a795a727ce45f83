"""Mixed precision: float16 or bfloat16 inputs with float32 coeffs and/or initial. Every backend against
the float64 loop from the same values, each derivative in its argument's dtype (float32 for the float32
arguments), the accuracy that float32 decays near 1 keep, and the dtypes that stay refused.

The bound on a result rounded once: the kernels read 16-bit inputs and float32 coeffs and initial
exactly, accumulate in float32 and round each result to its dtype, so each element is the float64
answer rounded to nearest (within the unit roundoff u of |answer|), up to float32's accumulation
error (at most TOLERANCE[float32] of the largest |answer|)."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import TOLERANCE, assert_matches, random_coeffs, random_values, reference, reference_gradients, wide
from torch.func import grad, jvp, vmap

import linrec

HALF_DTYPES = [torch.bfloat16, torch.float16]
#: The largest relative error of rounding to nearest.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
#: float32 accumulation, relative to the largest value.
ACCUMULATION = TOLERANCE[torch.float32]
BACKENDS = ["auto", "triton", *linrec.REFERENCES]
MIXES = [("coeffs",), ("initial",), ("coeffs", "initial")]

# name: (inputs shape, dim, coeffs shape (None: inputs'), with initial, cu_seqlens offsets, log_coeffs)
CASES = {
    "time_last": ((3, 50), -1, None, True, None, False),
    "time_last_per_row": ((4, 50), -1, (4, 1), False, None, False),
    "btc": ((2, 40, 3), 1, None, True, None, False),
    "btc_per_channel": ((2, 40, 3), 1, (3,), True, None, False),
    "btc_scalar": ((2, 40, 3), 1, (), False, None, False),
    "btc_log_coeffs": ((2, 40, 3), 1, None, True, None, True),
    "packed_initial": ((1, 40, 3), 1, None, True, [0, 9, 9, 25, 26, 40], False),
    # 16 channels: the derivatives of a per-channel coefficient are sums over its steps that may cancel,
    # and test_derivatives_of_every_order bounds errors by the largest of them.
    "packed_log_per_channel": ((1, 40, 16), 1, (16,), True, [0, 9, 9, 25, 26, 40], True),
}
#: (case, the arguments made float32): every mix a case has the arguments for.
CASE_MIXES = [(case, mix) for case, spec in CASES.items() for mix in MIXES if spec[3] or mix == ("coeffs",)]


def _triton_interpreted(device: str) -> bool:
    return device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def _skip_unless_runs(backend: str, device: str) -> None:
    if backend == "triton" and (linrec._core.triton.missing() is not None or
                                (device == "cpu" and not _triton_interpreted(device))):
        pytest.skip("needs triton: on a GPU, or on its interpreter (TRITON_INTERPRET=1)")


def _units(backend: str, device: str, dtype: torch.dtype) -> float:
    """How many unit roundoffs one rounding to `dtype` may cost: one (to nearest), or two under Triton's
    interpreter, whose float32-to-bfloat16 cast truncates (compiled Triton rounds to nearest)."""
    return 2.0 if backend == "triton" and _triton_interpreted(device) and dtype == torch.bfloat16 else 1.0


def assert_rounded(actual, expected, dtype, what, units=1.0, magnitude=None):
    """Each element of `actual` within `units` unit roundoffs of `dtype` of its `magnitude` (|expected|;
    for a sum, the sum of its terms' magnitudes) plus float32's accumulation error."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    magnitude = expected.abs() if magnitude is None else magnitude
    actual = actual.detach().cpu().double()
    assert torch.isfinite(actual).all(), f"{what}: {(~torch.isfinite(actual)).sum().item()} non-finite elements"
    bound = units * UNIT_ROUNDOFF[dtype] * magnitude + ACCUMULATION * magnitude.max()
    excess = ((actual - expected).abs() - bound).flatten()
    worst = excess.argmax().item()
    assert excess[worst] <= 0, (
        f"{what}: element {worst} is {actual.flatten()[worst].item():.6g}, the float64 answer "
        f"{expected.flatten()[worst].item():.6g}, past the bound {bound.flatten()[worst].item():.3g} ({dtype})"
    )


def _operands(case, dtype, float32_args, device, min_magnitude=0.0):
    """(inputs, coeffs, keyword arguments) of a case: inputs in `dtype`, coeffs and initial in float32
    where named in `float32_args`, else in `dtype`; coefficients of magnitude at least `min_magnitude`."""
    shape, dim, coeffs_shape, with_initial, offsets, log_coeffs = CASES[case]
    coeffs_dtype, initial_dtype = (torch.float32 if name in float32_args else dtype for name in ("coeffs", "initial"))
    inputs = random_values(shape, dtype, device)
    coeffs = random_coeffs(shape if coeffs_shape is None else coeffs_shape, torch.float64, min_magnitude=min_magnitude)
    if coeffs_shape is not None:
        coeffs = coeffs * 0.9  # a shared coefficient near 1 carries every step's rounding over the whole length
    if log_coeffs:
        coeffs = coeffs.abs().clamp_min(0.05).log()
    cu_seqlens = None if offsets is None else torch.tensor(offsets, device=device)
    initial = None
    if with_initial:
        initial_shape = [size for d, size in enumerate(shape) if d != dim % len(shape)]
        if offsets is not None:
            initial_shape[0] = len(offsets) - 1
        initial = random_values(initial_shape, initial_dtype, device)
    kwargs = dict(dim=dim, initial=initial, cu_seqlens=cu_seqlens, log_coeffs=log_coeffs)
    return inputs, coeffs.to(coeffs_dtype).to(device), kwargs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case, float32_args", CASE_MIXES, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_outputs_and_gradients_match_the_float64_loop(device, seed, dtype, case, float32_args, reverse, backend):
    _skip_unless_runs(backend, device)
    # Heinsen's log space loses precision in the gradient of coefficients near 0 (d log c = dc / c), in
    # float32 alone too.
    inputs, coeffs, kwargs = _operands(case, dtype, float32_args, device, 0.5 if backend == "heinsen" else 0.0)
    kwargs["reverse"] = reverse
    leaves = [t.requires_grad_() for t in (inputs, coeffs, kwargs["initial"]) if t is not None]
    outputs = linrec.linrec(*leaves[:2], **kwargs, backend=backend)
    assert outputs.dtype == dtype
    units = _units(backend, device, dtype)
    assert_rounded(outputs, reference(inputs, coeffs, **kwargs), dtype, "outputs", units)

    d_outputs = random_values(inputs.shape, dtype, device)
    grads = torch.autograd.grad(outputs, leaves, d_outputs)
    expected = reference_gradients(d_outputs, inputs, coeffs, **kwargs)
    # d_coeffs multiplies the 16-bit outputs (one rounding) and is rounded itself where coeffs are 16-bit.
    for name, gradient, leaf, want, rounding in zip(("d_inputs", "d_coeffs", "d_initial"), grads, leaves, expected,
                                                    (1, 2, 1)):
        assert gradient.dtype == leaf.dtype, f"{name}: {gradient.dtype}, its argument {leaf.dtype}"
        magnitude = None
        if name == "d_coeffs" and coeffs.shape != inputs.shape:
            per_element = reference_gradients(d_outputs, inputs, coeffs.expand(inputs.shape), **kwargs)[1]
            magnitude = per_element.abs().sum_to_size(coeffs.shape)
        assert_rounded(gradient, want, dtype, name, rounding * units, magnitude)


@pytest.mark.parametrize("name", list(linrec.REFERENCES))
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_recurrences_take_float32_coeffs(device, seed, dtype, name):
    """The time-last recurrences themselves, as benchmarks call them: 16-bit inputs, float32 coeffs."""
    inputs = random_values((3, 40), dtype, device, requires_grad=True)
    coeffs = random_coeffs((3, 40), torch.float32, device, requires_grad=True, min_magnitude=0.5)
    outputs = linrec.REFERENCES[name](inputs, coeffs, True)
    assert outputs.dtype == dtype
    assert_rounded(outputs, reference(inputs, coeffs, reverse=True), dtype, "outputs")
    d_outputs = random_values(inputs.shape, dtype, device)
    grads = torch.autograd.grad(outputs, (inputs, coeffs), d_outputs)
    for what, gradient, leaf, want in zip(("d_inputs", "d_coeffs"), grads, (inputs, coeffs),
                                          reference_gradients(d_outputs, inputs, coeffs, reverse=True)):
        assert gradient.dtype == leaf.dtype, what
        assert_rounded(gradient, want, dtype, what)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_decays_near_1_keep_their_accuracy(device, seed, backend):
    """The issue's case: decays in [0.999, 1), which bfloat16 stores as exactly 1 (the recurrence then
    sums every input, a relative error of order 1), read in float32 with bfloat16 inputs."""
    _skip_unless_runs(backend, device)
    inputs = random_values((1, 2048, 8), torch.bfloat16, device)
    decays = (0.999 + 0.001 * torch.rand(inputs.shape, device=device)).clamp_max(1 - 2**-24)
    assert (decays.bfloat16() == 1).all()
    outputs = linrec.linrec(inputs, decays, dim=1, backend=backend)
    expected = reference(inputs, decays, dim=1)
    error = ((outputs.cpu().double() - expected).abs().max() / expected.abs().max()).item()
    assert error < 1e-2, f"max error / max |reference| = {error:.3g}"
    assert_rounded(outputs, expected, torch.bfloat16, "outputs", _units(backend, device, torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_equals_the_float32_call_rounded(device, seed, dtype, backend):
    """float32 coeffs and initial with 16-bit inputs compute what the float32 call on the upcast inputs
    does, rounded: at most one unit in the last place apart (2 u), where a value next to a rounding
    boundary rounds to the other side after float32 sums taken in another order."""
    _skip_unless_runs(backend, device)
    inputs, coeffs, kwargs = _operands("packed_log_per_channel", dtype, ("coeffs", "initial"), device)
    mixed = linrec.linrec(inputs, coeffs, **kwargs, backend=backend)
    upcast = linrec.linrec(inputs.float(), coeffs, **kwargs, backend=backend).to(dtype)
    assert_rounded(mixed, wide(upcast), dtype, "mixed against upcast", 2 * _units(backend, device, dtype))


# (inputs dtype, the argument given another dtype, its dtype, the dtypes the message says it may have)
REFUSED = [
    (torch.bfloat16, "coeffs", torch.float16, r"\(torch.bfloat16\) or torch.float32"),
    (torch.float16, "initial", torch.float64, r"\(torch.float16\) or torch.float32"),
    (torch.float32, "coeffs", torch.float64, r"\(torch.float32\)"),
    (torch.float64, "coeffs", torch.float32, r"\(torch.float64\)"),
    (torch.float64, "initial", torch.float32, r"\(torch.float64\)"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, name, other, allowed", REFUSED, ids=str)
def test_other_dtypes_are_refused(device, dtype, name, other, allowed, backend):
    arguments = dict(inputs=torch.randn(2, 5, device=device, dtype=dtype),
                     coeffs=torch.rand(2, 5, device=device, dtype=dtype),
                     initial=torch.randn(2, device=device, dtype=dtype))
    arguments[name] = arguments[name].to(other)
    message = f"{name} must have the dtype of inputs {allowed}, got {other}$"
    with pytest.raises(TypeError, match=f"^linrec: {message}"):
        linrec.linrec(**arguments, backend=backend)
    meta = {key: value.to("meta") for key, value in arguments.items()}  # the fake kernel's checks
    with pytest.raises(TypeError, match=f"^linrec.forward: {message}"):
        torch.ops.linrec.forward(meta["inputs"], meta["coeffs"], initial=meta["initial"])


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("float32_args", MIXES, ids="+".join)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_derivatives_of_every_order(device, seed, dtype, float32_args, backend):
    """jvp (forward mode), a gradient penalty (double backward), jvp of grad (forward over reverse) and
    per-sample gradients (vmap of grad) against the same transforms of the float64 loop: each derivative
    in its argument's dtype. Several rounded stages: twice TOLERANCE of max |reference| (at most 1.2 of
    one seen over 400 seeds), and twice that where Triton's interpreter truncates to bfloat16."""
    _skip_unless_runs(backend, device)
    if backend == "triton" and _triton_interpreted(device) and (dtype == torch.bfloat16) != (len(float32_args) == 1):
        # Triton's interpreter takes half a minute a case: each mix runs once, with both 16-bit types among them.
        pytest.skip("the interpreter runs bfloat16 with one float32 argument, float16 with both")
    inputs, coeffs, kwargs = _operands("packed_log_per_channel", dtype, float32_args, device)
    kwargs["reverse"] = True
    primals = (inputs, coeffs, kwargs.pop("initial"))
    tangents = tuple(random_values(t.shape, t.dtype, device) for t in primals)
    # Per-sample inputs and initial states, coeffs shared.
    samples = tuple(random_values((3, *t.shape), t.dtype, device) for t in (inputs, primals[2]))
    dtypes = tuple(t.dtype for t in primals)

    def derivatives(backend, primals, tangents, samples):
        def recurrence(inputs, coeffs, initial):  # the offsets on the device of the call
            packing = dict(kwargs, cu_seqlens=kwargs["cu_seqlens"].to(inputs.device))
            return linrec.linrec(inputs, coeffs, initial=initial, **packing, backend=backend)

        # Means, not sums: the second derivatives of sums over shared coefficients pass float16's range.
        def loss(*tensors):
            return (recurrence(*tensors).float() ** 2).mean()

        leaves = [t.detach().requires_grad_() for t in primals]
        first = torch.autograd.grad(loss(*leaves), leaves, create_graph=True)
        penalized = torch.autograd.grad(sum((g.float() ** 2).mean() for g in first), leaves)
        per_sample = vmap(grad(loss, argnums=(1, 2)), in_dims=(0, None, 0))(samples[0], primals[1], samples[1])
        return {
            "jvp": ((jvp(recurrence, primals, tangents)[1],), (dtype,)),
            "gradient penalty": (first + penalized, dtypes * 2),
            "jvp of grad": (jvp(grad(loss, argnums=(0, 1, 2)), primals, tangents)[1], dtypes),
            "per-sample grad": (per_sample, dtypes[1:]),
        }

    expected = derivatives("loop", *(tuple(map(wide, tensors)) for tensors in (primals, tangents, samples)))
    for what, (results, want_dtypes) in derivatives(backend, primals, tangents, samples).items():
        assert tuple(result.dtype for result in results) == want_dtypes, what
        for index, (result, want) in enumerate(zip(results, expected[what][0])):
            error = ((result.detach().cpu().double() - want).abs().max() / want.abs().max()).item()
            assert error <= 2 * TOLERANCE[dtype] * _units(backend, device, dtype), (
                f"{what} [{index}]: max error / max |reference| = {error:.3g}")


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph(device, seed, compiler, backend):
    _skip_unless_runs(backend, device)
    torch._dynamo.reset()
    inputs, coeffs, kwargs = _operands("packed_initial", torch.bfloat16, ("coeffs", "initial"), device)
    leaves = (inputs.requires_grad_(), coeffs.requires_grad_(), kwargs.pop("initial").requires_grad_())

    def step(inputs, coeffs, initial):
        return (linrec.linrec(inputs.sin(), coeffs, initial=initial, **kwargs, backend=backend).float() ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend=compiler)
    grads = torch.autograd.grad(compiled(*leaves), leaves)
    expected = torch.autograd.grad(step(*leaves), leaves)
    for gradient, want, leaf in zip(grads, expected, leaves):
        assert gradient.dtype == want.dtype == leaf.dtype
        assert_matches(gradient, wide(want), torch.bfloat16, "compiled against eager")
    torch._dynamo.reset()


@pytest.mark.parametrize("case, float32_args", [("btc", ("coeffs",)), ("btc_per_channel", ("initial",)),
                                                ("time_last_per_row", ("coeffs",)),
                                                ("packed_log_per_channel", ("coeffs", "initial"))],
                         ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("family", ["", "triton_"], ids=["compiled", "triton"])
def test_opcheck(device, seed, case, float32_args, family):
    _skip_unless_runs("triton" if family else "auto", device)
    forward, backward = getattr(torch.ops.linrec, f"{family}forward"), getattr(torch.ops.linrec, f"{family}backward")
    inputs, coeffs, kwargs = _operands(case, torch.bfloat16, float32_args, device)
    initial = kwargs["initial"]
    args = (kwargs["dim"], True, initial, kwargs["cu_seqlens"], kwargs["log_coeffs"])
    for tensor in (inputs, coeffs, initial):
        if tensor is not None:
            tensor.requires_grad_()  # opcheck then checks the derivatives' registration too
    torch.library.opcheck(forward.default, (inputs, coeffs, *args))
    outputs = forward(inputs, coeffs, *args).detach()
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in (coeffs, outputs, *args)]
    torch.library.opcheck(backward.default, (torch.randn_like(outputs), *detached))
