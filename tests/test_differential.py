"""Property-based differential tests: hypothesis draws shapes, layouts and strides, dtypes, lengths, coeffs
shapes, packed boundaries (empty sequences included), initial, reverse, log_coeffs and value regimes
(normal, huge, tiny, exact 0 and 1, negative, NaN and +-Inf), and every backend's outputs and gradients
are compared with the sequential loop (test_semantics.check) and with each other.

Profiles (LINREC_HYPOTHESIS_PROFILE): "ci" (the default: few, short examples, the CPU kernels and the
Triton kernels through Triton's interpreter) and "gpu" (many examples, lengths across the CUDA kernels'
tiles and chained chunks). A failure prints the falsifying example and the blob that replays it
(@reproduce_failure)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linrec
from helpers import triton_runs_on
from test_semantics import check

_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=40, deadline=None, print_blob=True, suppress_health_check=_HEALTH)
settings.register_profile("gpu", max_examples=200, deadline=None, print_blob=True, suppress_health_check=_HEALTH)
PROFILE = os.environ.get("LINREC_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
#: Lengths drawn: up to a few tiles on the CPU; across the GPU's tiles (2048 float32 elements a chained
#: chunk along rows, 128 steps a strided tile) and several chained chunks on the GPU.
MAX_LENGTH = 5000 if PROFILE == "gpu" else 70
BOUNDARY_LENGTHS = [0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65]
if PROFILE == "gpu":
    BOUNDARY_LENGTHS += [127, 128, 129, 255, 256, 257, 2047, 2048, 2049, 4095, 4096, 4097]

REGIMES = ["normal", "huge", "tiny", "zero_one", "negative", "special"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@st.composite
def problems(draw, complex_ok=True):
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]
                                 + ([torch.complex64] if complex_ok else [])))
    regime = draw(st.sampled_from(REGIMES)) if dtype in (torch.float32, torch.float64, torch.bfloat16) else "normal"
    layout = draw(st.sampled_from(["time_last", "btc", "transposed"]))
    length = draw(st.one_of(st.sampled_from(BOUNDARY_LENGTHS), st.integers(0, MAX_LENGTH)))
    packed = draw(st.booleans()) and layout != "transposed"
    batch = 1 if packed else draw(st.integers(1, 3))
    channels = draw(st.integers(1, 5))
    if layout == "time_last":
        shape, dim = (batch, channels, length), -1
    else:
        shape, dim = (batch, length, channels), 1
    coeffs_kind = draw(st.sampled_from(["full", "full", "channel", "scalar", "row"]))
    coeffs_shape = {
        "full": shape,
        "channel": (channels, 1) if layout == "time_last" else (channels,),
        "scalar": (),
        "row": (batch, 1, length) if layout == "time_last" else (batch, length, 1),
    }[coeffs_kind]
    cu_seqlens = None
    if packed:
        cuts = sorted(draw(st.lists(st.integers(0, length), max_size=5)))
        cu_seqlens = torch.tensor([0, *cuts, length], dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    initial = None
    if draw(st.booleans()):
        sequences = cu_seqlens.shape[0] - 1 if packed else batch
        initial = (sequences, channels)
    log_coeffs = not dtype.is_complex and draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(dtype=dtype, regime=regime, layout=layout, shape=shape, dim=dim, coeffs_shape=coeffs_shape,
                cu_seqlens=cu_seqlens, initial=initial, reverse=draw(st.booleans()), log_coeffs=log_coeffs, seed=seed)


def _values(generator, shape, regime, dtype, coefficients):
    """Values of a regime: inputs ~ N(0, 1) and coefficients in (-1, 1) scaled or replaced by it."""
    base = torch.randn(shape, generator=generator, dtype=torch.float64)
    if coefficients:
        base = torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1
    if dtype.is_complex:
        phase = torch.rand(shape, generator=generator, dtype=torch.float64) * 6.283
        return torch.polar(base.abs(), phase).to(dtype)
    if regime == "huge":
        base = base * (4.0 if coefficients else 1e30)
    elif regime == "tiny":
        base = base * (1e-3 if coefficients else 1e-35)
    elif regime == "zero_one":
        choice = torch.randint(0, 3, shape, generator=generator)
        base = torch.where(choice == 0, 0.0, torch.where(choice == 1, 1.0, base))
    elif regime == "negative":
        base = -base.abs()
    elif regime == "special":
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, 1.0], dtype=torch.float64)
        picks = torch.rand(shape, generator=generator) < 0.03
        chosen = specials[torch.randint(0, len(specials), shape, generator=generator)]
        base = torch.where(picks, chosen, base)
    return base.to(dtype)


def materialize(problem):
    generator = torch.Generator().manual_seed(problem["seed"])
    dtype, regime, shape = problem["dtype"], problem["regime"], problem["shape"]
    inputs = _values(generator, shape, regime, dtype, False)
    coeffs = _values(generator, problem["coeffs_shape"], regime, dtype, True)
    if problem["log_coeffs"]:
        coeffs = coeffs.abs().clamp_min(1e-30).log().to(dtype) if regime != "special" else coeffs
    if problem["layout"] == "transposed":  # the same values through a non-contiguous view
        inputs = inputs.transpose(1, 2).contiguous().transpose(1, 2)
    initial = None
    if problem["initial"] is not None:
        initial = _values(generator, problem["initial"], "normal" if regime == "zero_one" else regime, dtype, False)
    kwargs = dict(dim=problem["dim"], reverse=problem["reverse"], initial=initial, cu_seqlens=problem["cu_seqlens"],
                  log_coeffs=problem["log_coeffs"])
    return inputs, coeffs, kwargs


@given(problem=problems())
def test_kernels_against_the_loop(device, problem):
    """The compiled kernels (CPU, and CUDA when there is a GPU) against the sequential loop."""
    inputs, coeffs, kwargs = materialize(problem)
    check(inputs, coeffs, device, **kwargs)


@given(problem=problems(complex_ok=False))
def test_triton_against_the_loop(device, problem):
    """The Triton kernels (on the GPU, or through Triton's interpreter on the CPU) against the loop, and
    against the compiled kernels: the same non-finite results, finite ones within rounding."""
    if not triton_runs_on(device):
        pytest.skip("needs triton: on a GPU, or on its interpreter (TRITON_INTERPRET=1)")
    inputs, coeffs, kwargs = materialize(problem)
    outputs = check(inputs, coeffs, device, backend="triton", **kwargs).detach().cpu().double()
    compiled = linrec.linrec(inputs.to(device), coeffs.to(device),
                             **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
    compiled = compiled.cpu().double()
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(test(outputs), test(compiled)), test.__name__
    finite = torch.isfinite(outputs)
    if finite.any():
        tolerance = {torch.float64: 1e-10, torch.float32: 1e-4}.get(problem["dtype"], 3e-2)
        scale = compiled[finite].abs().max().clamp_min(1e-30).item()
        assert ((outputs[finite] - compiled[finite]).abs().max() <= tolerance * scale).item()


@given(problem=problems(complex_ok=False))
def test_references_against_the_loop(device, problem):
    """The pure-PyTorch parallel references ("hop", torch's associative_scan, and "heinsen", log space)
    against the loop on values whose states stay finite: they compose products of coefficients, as the
    kernels do before their rescan, and follow the loop up to rounding there."""
    problem = dict(problem, regime="normal", dtype=torch.float64)
    inputs, coeffs, kwargs = materialize(problem)
    # Products composed in a tree lose more than the loop's float64 rounding. Log space more: its
    # gradients pass through exponentials of prefix sums of logs, and on CUDA they differ from run to
    # run by up to 2e-9 of their largest value (1e-6 bounds that, far below a formula's error).
    for backend, tolerance_factor in (("hop", 1e3), ("heinsen", 1e6)):
        if backend == "heinsen" and (problem["log_coeffs"] or (coeffs == 0).any()):
            continue  # log space: zero coefficients are -inf logs, whose gradient is not the loop's
        try:
            check(inputs, coeffs, device, backend=backend, tolerance_factor=tolerance_factor, **kwargs)
        except AssertionError as error:
            raise AssertionError(f"backend={backend!r}: {error}") from None
