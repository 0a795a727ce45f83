"""The Triton backend (backend="triton") against the float64 reference: every feature, tile boundaries,
derivatives of every order, opcheck and torch.compile. On a machine without a GPU the kernels run on
CPU tensors through Triton's interpreter (conftest.py sets TRITON_INTERPRET=1 there), on small
shapes; on a GPU machine they run compiled, on larger shapes too."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from helpers import (
    assert_matches,
    check_against_reference,
    random_coeffs,
    random_values,
    reference,
    reference_gradients,
    strided_view,
    TRITON_DEVICES,
)

import linrec

_HAS_TRITON = importlib.util.find_spec("triton") is not None
_INTERPRETED = _HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(params=TRITON_DEVICES)
def device(request) -> str:
    return request.param


def triton_ops():
    from linrec._core.triton import launch

    return launch


# (inputs shape, dim, coeffs shape or None for full, initial, packing offsets or None, log_coeffs)
CASES = {
    "time_last": ((3, 45), -1, None, False, None, False),
    "time_last_initial": ((2, 3, 45), -1, None, True, None, False),
    "btc": ((2, 37, 5), 1, None, False, None, False),
    "btc_initial": ((2, 37, 5), 1, None, True, None, False),
    "time_first": ((41, 3), 0, None, True, None, False),
    "per_channel_coeffs": ((2, 37, 6), 1, (6,), True, None, False),
    "per_step_coeffs": ((2, 37, 6), 1, (2, 37, 1), False, None, False),
    "scalar_coeffs": ((3, 40), -1, (), False, None, False),
    "per_row_coeffs_time_last": ((2, 6, 41), -1, (6, 1), False, None, False),
    "head_channel_coeffs": ((2, 3, 21, 4), 2, (3, 1, 4), True, None, False),
    "log_coeffs": ((3, 45), -1, None, True, None, True),
    "log_coeffs_broadcast": ((2, 33, 4), 1, (4,), False, None, True),
    "packed": ((1, 40, 3), 1, None, False, [0, 5, 5, 17, 18, 40], False),
    "packed_initial": ((1, 40, 3), 1, None, True, [0, 5, 5, 17, 18, 40], False),
    "packed_time_last_initial_log": ((1, 2, 33), 2, None, True, [0, 1, 20, 33], True),
    "length_1": ((4, 1), -1, None, True, None, False),
}
# Small enough for gradgradcheck on Triton's interpreter: each numerical derivative is one call per element.
SMALL_CASES = {
    "btc_initial": ((2, 5, 2), 1, None, True, None, False),
    "per_channel_coeffs": ((2, 5, 2), 1, (2,), True, None, False),
    "packed_initial": ((1, 7, 2), 1, None, True, [0, 3, 3, 7], False),
    "log_coeffs": ((2, 6), -1, None, True, None, True),
}


def _case(name, dtype, device, cases=CASES):
    shape, dim, coeffs_shape, with_initial, offsets, log_coeffs = cases[name]
    inputs = random_values(shape, dtype, device)
    coeffs = random_coeffs(shape if coeffs_shape is None else coeffs_shape, dtype, device)
    if coeffs_shape is not None:
        coeffs = coeffs * 0.9  # a shared coefficient near 1 carries every step's rounding over the whole length
    if log_coeffs:
        coeffs = coeffs.abs().clamp_min(0.05).log()
    cu_seqlens = None if offsets is None else torch.tensor(offsets, dtype=torch.int32, device=device)
    initial = None
    if with_initial:
        initial_shape = [size for d, size in enumerate(shape) if d != dim % len(shape)]
        if cu_seqlens is not None:
            initial_shape[0] = len(offsets) - 1
        initial = random_values(initial_shape, dtype, device)
    return inputs, coeffs, dict(dim=dim, initial=initial, cu_seqlens=cu_seqlens, log_coeffs=log_coeffs)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_every_feature_matches_reference(device, seed, dtype, case, reverse):
    inputs, coeffs, kwargs = _case(case, dtype, device)
    check_against_reference(inputs, coeffs, dtype, reverse=reverse, backend="triton", **kwargs)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", ["btc_initial", "per_channel_coeffs", "packed_initial", "log_coeffs"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_types_accumulate_in_float32(device, seed, dtype, case, reverse):
    inputs, coeffs, kwargs = _case(case, dtype, device)
    check_against_reference(inputs, coeffs, dtype, reverse=reverse, backend="triton", **kwargs)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [1, 15, 16, 17, 48, 100])
@pytest.mark.parametrize("tile", [(16, 1), (16, 2), (32, 4)], ids=str)
def test_tile_boundaries(device, seed, tile, length, reverse):
    """Forced tiles across chunk boundaries: the carry between chunks, forward and backward, with initial."""
    dtype = torch.float64
    for shape, dim in (((3, length), -1), ((2, length, 5), 1)):
        inputs, coeffs = random_values(shape, dtype, device), random_coeffs(shape, dtype, device)
        initial = random_values([s for d, s in enumerate(shape) if d != dim % len(shape)], dtype, device)
        kwargs = dict(dim=dim, reverse=reverse, initial=initial)
        outputs = torch.ops.linrec.triton_forward(inputs, coeffs, dim, reverse, initial, None, False, *tile)
        assert_matches(outputs, reference(inputs, coeffs, **kwargs), dtype)
        d_outputs = random_values(shape, dtype, device)
        grads = torch.ops.linrec.triton_backward(d_outputs, coeffs, outputs, dim, reverse, initial, None, False, *tile)
        for name, grad, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads,
                                    reference_gradients(d_outputs, inputs, coeffs, **kwargs)):
            assert_matches(grad, want, dtype, name)


def _check_ops(inputs, coeffs, kwargs, tile):
    """The two ops with a forced tile against the float64 reference: outputs and every gradient."""
    dim, reverse, initial = kwargs["dim"], kwargs["reverse"], kwargs["initial"]
    args = (dim, reverse, initial, kwargs["cu_seqlens"], kwargs["log_coeffs"], *tile)
    outputs = torch.ops.linrec.triton_forward(inputs, coeffs, *args)
    assert_matches(outputs, reference(inputs, coeffs, **kwargs), inputs.dtype)
    d_outputs = random_values(inputs.shape, inputs.dtype, inputs.device)
    grads = torch.ops.linrec.triton_backward(d_outputs, coeffs, outputs, *args)
    expected = reference_gradients(d_outputs, inputs, coeffs, **kwargs)
    for name, grad, want in zip(("d_inputs", "d_coeffs", "d_initial"), grads, expected):
        if name != "d_initial" or initial is not None:
            assert_matches(grad, want, inputs.dtype, name)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", ["time_last", "time_last_initial", "per_channel_coeffs", "per_step_coeffs",
                                  "packed_initial", "log_coeffs_broadcast"])
def test_time_split_across_programs(device, seed, monkeypatch, case, reverse):
    """Few rows and a long time dim: segments scanned by separate programs, joined by a scan over the
    segments' composed maps (forced 16-step tiles make 301 steps several segments, and the threshold is
    raised so that the few rows of these shapes split on any machine)."""
    from linrec._core.triton import configs, launch

    monkeypatch.setattr(configs, "SPLIT_BELOW_PROGRAMS_PER_MULTIPROCESSOR", 1 << 20)
    launch._plan.cache_clear()
    monkeypatch.setattr(launch, "_plan", launch._plan.__wrapped__)  # no plan cached under these settings
    shape, dim, coeffs_shape, with_initial, offsets, log_coeffs = CASES[case]
    long_shape = list(shape)
    long_shape[dim] = 301
    if offsets is not None:
        offsets = [0, 40, 40, 170, 171, 301]
    if coeffs_shape is not None and len(coeffs_shape) == len(shape) and coeffs_shape[dim] == shape[dim]:
        coeffs_shape = tuple(long_shape[d] if d == dim else size for d, size in enumerate(coeffs_shape))
    cases = {case: (tuple(long_shape), dim, coeffs_shape, with_initial, offsets, log_coeffs)}
    inputs, coeffs, kwargs = _case(case, torch.float64, device, cases)
    layout_channels = 1 if dim % inputs.dim() == inputs.dim() - 1 else inputs.shape[-1]
    tile = (16, max(1, 1 << (layout_channels - 1).bit_length()))
    assert launch._plan(plan_layout(inputs, kwargs["dim"]), inputs.dtype, inputs.device, *tile).segments > 1
    _check_ops(inputs, coeffs, dict(kwargs, reverse=reverse), tile)


def plan_layout(inputs, dim):
    from linrec._core.triton.layout import plan

    return plan(tuple(inputs.shape), dim % inputs.dim(), (inputs.stride(),))


@pytest.mark.parametrize("kind", ["transposed", "sliced"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_strided_views(device, seed, dim, kind):
    shape = (3, 21, 5)
    inputs = strided_view(shape, torch.float32, device, kind)
    coeffs = strided_view(shape, torch.float32, device, "transposed" if kind == "sliced" else kind, random_coeffs)
    for reverse in (False, True):
        check_against_reference(inputs.detach(), coeffs.detach(), torch.float32, dim=dim, reverse=reverse,
                                backend="triton")


def test_layout_that_does_not_merge_runs_on_copies(device, seed):
    """Channel dims whose strides cannot merge into one (two channel dims, transposed): the op scans
    contiguous copies and writes the result in the layout it promised."""
    from linrec._core.triton.layout import plan

    inputs = random_values((2, 19, 4, 3), torch.float32, device).transpose(-1, -2)
    coeffs = random_coeffs((2, 19, 3, 4), torch.float32, device)
    assert plan(tuple(inputs.shape), 1, (inputs.stride(), coeffs.stride())) is None
    check_against_reference(inputs, coeffs, torch.float32, dim=1, backend="triton")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("case", list(SMALL_CASES))
def test_gradcheck_gradgradcheck_and_forward_mode(device, seed, case, reverse):
    inputs, coeffs, kwargs = _case(case, torch.float64, device, SMALL_CASES)
    initial = kwargs.pop("initial")
    leaves = [t.requires_grad_() for t in (inputs, coeffs, initial) if t is not None]

    def function(*tensors):
        return linrec.linrec(*tensors[:2], initial=tensors[2] if len(tensors) > 2 else None, reverse=reverse,
                             backend="triton", **kwargs)

    # The interpreter runs each call in Python, so there every derivative is checked along random directions
    # (fast mode: a few calls in all) rather than one element at a time.
    fast_mode = device == "cpu"
    assert torch.autograd.gradcheck(function, leaves, check_forward_ad=True, fast_mode=fast_mode)
    assert torch.autograd.gradgradcheck(function, leaves, fast_mode=fast_mode)


def test_torch_func_hessian_and_vmap(device, seed):
    inputs, coeffs, kwargs = _case("btc_initial", torch.float64, device, SMALL_CASES)

    def loss(coeffs, backend):
        return linrec.linrec(inputs, coeffs, backend=backend, **kwargs).square().sum()

    hessian = torch.func.hessian(loss)(coeffs, "triton")
    assert_matches(hessian, torch.func.hessian(loss)(coeffs, "loop").cpu(), torch.float64, "hessian")
    batch = random_values((3, *inputs.shape), torch.float64, device)
    mapped = torch.vmap(lambda x: linrec.linrec(x, coeffs, backend="triton", **kwargs))(batch)
    for sample, outputs in zip(batch, mapped):
        assert_matches(outputs, reference(sample, coeffs, **kwargs), torch.float64)


@pytest.mark.parametrize("case", ["btc_initial", "per_channel_coeffs", "packed_initial", "log_coeffs_broadcast"])
def test_opcheck(device, seed, case):
    inputs, coeffs, kwargs = _case(case, torch.float32, device)
    args = (kwargs["dim"], False, kwargs["initial"], kwargs["cu_seqlens"], kwargs["log_coeffs"])
    torch.library.opcheck(torch.ops.linrec.triton_forward.default, (inputs, coeffs, *args))
    outputs = torch.ops.linrec.triton_forward(inputs, coeffs, *args)
    torch.library.opcheck(torch.ops.linrec.triton_backward.default, (torch.randn_like(outputs), coeffs, outputs, *args))


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph(device, seed, compiler):
    torch._dynamo.reset()
    inputs, coeffs, kwargs = _case("per_channel_coeffs", torch.float32, device)
    inputs.requires_grad_()
    coeffs.requires_grad_()

    def step(inputs, coeffs, initial):
        return linrec.linrec(inputs.sin(), coeffs, dim=1, initial=initial, backend="triton").sum()

    compiled = torch.compile(step, fullgraph=True, backend=compiler)
    loss = compiled(inputs, coeffs, kwargs["initial"])
    grads = torch.autograd.grad(loss, (inputs, coeffs))
    expected = torch.autograd.grad(step(inputs, coeffs, kwargs["initial"]), (inputs, coeffs))
    for grad, want in zip(grads, expected):
        assert_matches(grad, want.detach().double().cpu(), torch.float32)
    torch._dynamo.reset()


@pytest.mark.cuda
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape, dim, coeffs_shape", [
    ((300, 4099), -1, None), ((4, 2051, 96), 1, None), ((2, 3000, 70), 1, (70,)), ((2, 1025, 64), 1, (2, 1025, 1)),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_full_size_on_the_gpu(device, seed, dtype, shape, dim, coeffs_shape, reverse):
    if device != "cuda":
        pytest.skip("full-size shapes run compiled, on the GPU")
    inputs = random_values(shape, dtype, device)
    coeffs = random_coeffs(shape if coeffs_shape is None else coeffs_shape, dtype, device, min_magnitude=0.5) * 0.99
    check_against_reference(inputs, coeffs, dtype, dim=dim, reverse=reverse, backend="triton")


def test_complex_is_refused(device):
    inputs = torch.randn(2, 5, dtype=torch.complex64, device=device)
    with pytest.raises(TypeError, match="backend='triton' takes torch.float32, torch.float64, torch.float16 or torch.bfloat16, got torch.complex64"):
        linrec.linrec(inputs, inputs, backend="triton")


def test_forced_tile_must_be_a_power_of_two(device):
    inputs = torch.randn(2, 5, device=device)
    with pytest.raises(ValueError, match="block_length must be a power of two, got 24"):
        torch.ops.linrec.triton_forward(inputs, inputs, -1, False, None, None, False, 24, 1)


def test_missing_triton_is_named(monkeypatch):
    import linrec._core.triton

    monkeypatch.setattr(linrec._core.triton, "_INSTALLED", False)
    with pytest.raises(RuntimeError, match=r"backend='triton' needs the triton package, which is not installed: pip install triton"):
        linrec.linrec(torch.randn(2, 5), torch.rand(2, 5), backend="triton")
    with pytest.raises(RuntimeError, match="needs the triton package"):
        torch.ops.linrec.triton_forward(torch.randn(2, 5), torch.rand(2, 5))


@pytest.mark.skipif(not _HAS_TRITON or _INTERPRETED, reason="the kernels are compiled for a GPU here")
def test_cpu_tensors_need_the_interpreter():
    with pytest.raises(RuntimeError, match="backend='triton' runs CPU tensors only on Triton's interpreter"):
        linrec.linrec(torch.randn(2, 5), torch.rand(2, 5), backend="triton")


@pytest.mark.cuda
def test_auto_runs_triton_where_the_cuda_kernels_cannot(monkeypatch, seed):
    if not (_HAS_TRITON and torch.cuda.is_available()) or _INTERPRETED:
        pytest.skip("needs triton and a GPU")
    monkeypatch.setattr(linrec._core.backend, "HAS_CUDA_KERNELS", False)
    inputs, coeffs = random_values((3, 50), torch.float32, "cuda"), random_coeffs((3, 50), torch.float32, "cuda")
    assert linrec._core.backend.choose("auto", inputs) is linrec._core.autograd.TRITON
    assert_matches(linrec.linrec(inputs, coeffs), reference(inputs, coeffs), torch.float32)
