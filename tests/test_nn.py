"""linrec.nn (EMA, MinGRU, LRU) against their definitions written as Python loops over time in float64
(complex128), forward and backward (the input, the initial state and every parameter); chunked calls
and single steps against one full call; 16-bit inputs with decays near 1; argument errors."""

from __future__ import annotations

import copy
import doctest
import math

import pytest
import torch
from helpers import random_values, wide

import linrec
from linrec.nn import EMA, LRU, MinGRU

BATCH, TIME, IN, HIDDEN, STATE = 3, 37, 5, 6, 7  # odd sizes throughout

#: Max error over max |reference| of outputs and gradients, for inputs already rounded to the dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2}
#: The same for gradients of parameters: sums over batch and time of terms rounded to the dtype, which
#: cancel (the error scales with the terms, the reference with their sum).
PARAM_TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4, torch.bfloat16: 1e-1}


# --- the definitions, step by step in float64 --------------------------------------------------------------


def naive_ema(p, x, state):
    a = torch.sigmoid(p["decay_logit"])
    y = torch.zeros(x.shape[0], x.shape[2], dtype=x.dtype) if state is None else state
    outputs = []
    for t in range(x.shape[1]):
        y = a * y + (1 - a) * x[:, t]
        outputs.append(y)
    return torch.stack(outputs, 1), y


def naive_mingru(p, x, state, branch=None):
    """``branch``: where to take g's upper branch (v >= 0), given as the layer computed v (see below)."""
    weight, bias = p["proj.weight"], p["proj.bias"]
    hidden = weight.shape[0] // 2
    h = torch.zeros(x.shape[0], hidden, dtype=x.dtype) if state is None else state
    outputs = []
    for t in range(x.shape[1]):
        pre = x[:, t] @ weight.T + bias
        z = torch.sigmoid(pre[:, :hidden])
        v = pre[:, hidden:]
        upper = v >= 0 if branch is None else branch[:, t]
        candidate = torch.where(upper, v + 0.5, torch.sigmoid(v))
        h = (1 - z) * h + z * candidate
        outputs.append(h)
    return torch.stack(outputs, 1), h


def naive_lru(p, x, state):
    lam = torch.polar(torch.exp(-torch.exp(p["nu_log"])), torch.exp(p["theta_log"]))
    gamma = torch.exp(p["gamma_log"])
    b = torch.complex(p["B_re"], p["B_im"])
    c = torch.complex(p["C_re"], p["C_im"])
    h = torch.zeros(x.shape[0], b.shape[0], dtype=torch.complex128) if state is None else state
    outputs = []
    for t in range(x.shape[1]):
        h = lam * h + gamma * (x[:, t].to(torch.complex128) @ b.T)
        outputs.append((h @ c.T).real + p["D"] * x[:, t])
    return torch.stack(outputs, 1), h


KINDS = {
    "ema": (lambda: EMA(IN), naive_ema, IN),
    "mingru": (lambda: MinGRU(IN, HIDDEN), naive_mingru, HIDDEN),
    "lru": (lambda: LRU(IN, STATE), naive_lru, STATE),
}


def make(kind, device, dtype):
    """The layer (float64 parameters for float64 inputs, else float32) and its state's size and dtype."""
    factory, _, state_size = KINDS[kind]
    layer = factory().to(device, torch.float64 if dtype == torch.float64 else torch.float32)
    state_dtype = layer.state_dtype(dtype) if kind == "lru" else dtype
    return layer, state_size, state_dtype


def relative_error(actual, expected):
    actual = actual.detach().cpu().to(expected.dtype)
    assert torch.isfinite(actual).all()
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def assert_close_to(actual, expected, tolerance, what):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    error = relative_error(actual, expected)
    assert error <= tolerance, f"{what}: max error / max |ref| = {error:.3g} > {tolerance:.3g}"


def outputs_and_gradients(forward, x, state, params, d_y, d_state):
    """(y, new_state) and the gradients of x, state (when given) and every parameter, under upstream
    gradients d_y and d_state."""
    y, new_state = forward(x, state)
    leaves = [x, *([state] if state is not None else []), *params]
    grads = torch.autograd.grad((y, new_state), leaves, (d_y, d_state), allow_unused=True, materialize_grads=True)
    return y, new_state, grads


# --- against the definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_matches_definition(device, seed, kind, dtype, with_state):
    layer, state_size, state_dtype = make(kind, device, dtype)
    x = random_values((BATCH, TIME, IN), dtype, device, requires_grad=True)
    state = random_values((BATCH, state_size), state_dtype, device, requires_grad=True) if with_state else None
    out_size = HIDDEN if kind == "mingru" else IN
    d_y = random_values((BATCH, TIME, out_size), dtype, device)
    d_state = random_values((BATCH, state_size), state_dtype, device)
    names, params = zip(*layer.named_parameters())
    y, new_state, grads = outputs_and_gradients(layer, x, state, params, d_y, d_state)
    assert y.dtype == dtype and new_state.dtype == state_dtype and new_state.shape == (BATCH, state_size)

    params64 = {name: wide(p).requires_grad_() for name, p in zip(names, params)}
    x64 = wide(x).requires_grad_()
    state64 = wide(state).requires_grad_() if with_state else None

    branch = {}
    if kind == "mingru":
        # g's derivative jumps at v = 0 (1 above, 1/4 below): where rounding moves v across 0 the gradients
        # differ by more than any tolerance, so the reference takes g's branch where the layer took it.
        with torch.no_grad():
            weight, bias = (t.to(dtype) for t in params)
            branch["branch"] = (torch.nn.functional.linear(x, weight, bias)[..., HIDDEN:] >= 0).cpu()

    def naive(x, state):
        return KINDS[kind][1](params64, x, state, **branch)

    expected = outputs_and_gradients(naive, x64, state64, params64.values(), wide(d_y), wide(d_state))
    what = ["y", "new_state", "d_x", *(["d_state"] if with_state else []), *(f"d_{name}" for name in names)]
    for name, actual, want in zip(what, (y, new_state, *grads), (*expected[:2], *expected[2])):
        tolerance = PARAM_TOLERANCE[dtype] if name[2:] in names else TOLERANCE[dtype]
        assert_close_to(actual, want, tolerance, name)


# --- chunks and steps against one call ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_chunked_equals_full(device, seed, kind, dtype):
    """The sequence in 3 chunks (one of length 1), each from the previous chunk's state: the outputs, the
    final state and every gradient equal those of one call (training in chunks, streaming)."""
    layer, state_size, state_dtype = make(kind, device, dtype)
    x = random_values((BATCH, TIME, IN), dtype, device, requires_grad=True)
    initial = random_values((BATCH, state_size), state_dtype, device, requires_grad=True)
    params = list(layer.parameters())
    y_full, state_full = layer(x, initial)

    pieces, state = [], initial
    for begin, end in [(0, 15), (15, 16), (16, TIME)]:
        y, state = layer(x[:, begin:end], state)
        pieces.append(y)
    y_chunked = torch.cat(pieces, dim=1)
    tolerance = TOLERANCE[dtype]
    assert_close_to(y_chunked, wide(y_full), tolerance, "y")
    assert_close_to(state, wide(state_full), tolerance, "new_state")

    d_y, d_state = random_values(y_full.shape, dtype, device), random_values(state.shape, state_dtype, device)
    leaves = [x, initial, *params]
    expected = torch.autograd.grad((y_full, state_full), leaves, (d_y, d_state))
    actual = torch.autograd.grad((y_chunked, state), leaves, (d_y, d_state))
    for index, (grad, want) in enumerate(zip(actual, expected)):
        assert_close_to(grad, wide(want), tolerance, f"gradient {index}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_steps_equal_full(device, seed, kind, dtype):
    """step() position by position, from no state, gives the outputs and final state of one call."""
    layer, _, _ = make(kind, device, dtype)
    x = random_values((BATCH, TIME, IN), dtype, device)
    with torch.no_grad():
        y_full, state_full = layer(x)
        outputs, state = [], None
        for t in range(TIME):
            y_t, state = layer.step(x[:, t], state)
            outputs.append(y_t)
    assert_close_to(torch.stack(outputs, 1), wide(y_full), TOLERANCE[dtype], "y")
    assert_close_to(state, wide(state_full), TOLERANCE[dtype], "new_state")


# --- 16-bit inputs ------------------------------------------------------------------------------------------

#: Max error over max |float64 layer| over a long sequence: the rounding of 16-bit outputs (at most 0.0045 in
#: bfloat16 and 0.0008 in float16 over 5 seeds), where EMA's and MinGRU's decays rounded to 16 bits give
#: 0.5 to 2.8 (bfloat16) and 0.06 to 0.17 (float16).
LONG_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3}


def long_memory(kind, device):
    """The layer with decays in about [0.999, 0.9999], which 16-bit types round toward or to 1 (bfloat16
    stores 0.999 as 1.0, float16 0.9999)."""
    if kind == "ema":
        return EMA(IN, min_decay=0.999, max_decay=0.9999).to(device)
    if kind == "mingru":
        layer = MinGRU(IN, HIDDEN).to(device)
        with torch.no_grad():  # k = -7 + small terms: z about 1e-3, decays 1 - z about 0.999
            layer.proj.bias[:HIDDEN] = -7.0
            layer.proj.weight[:HIDDEN] *= 0.1
        return layer
    return LRU(IN, STATE, r_min=0.999, r_max=0.9999).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_16bit_inputs_keep_long_memory(device, seed, kind, dtype):
    """With 16-bit x over 4096 steps and decays near 1, the outputs are within 16-bit rounding of the same
    layer in float64: the decays reach linrec in float32 (complex64), not rounded to 16 bits."""
    layer = long_memory(kind, device)
    x = random_values((2, 4096, IN), dtype, device)
    with torch.no_grad():
        y, _ = layer(x)
        y64, _ = copy.deepcopy(layer).double()(x.double())
    assert y.dtype == dtype
    assert_close_to(y, y64.cpu(), LONG_TOLERANCE[dtype], "y")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_16bit_inputs_pass_float32_decays(monkeypatch, device, seed, kind, dtype):
    """With 16-bit x, forward passes linrec its (log-)decays in float32 and its inputs in the dtype of x
    (LRU: both complex64), and the state comes back in the layer's state dtype."""
    calls, linrec_call = [], linrec.linrec

    def spy(inputs, coeffs, *args, **kwargs):
        calls.append((inputs.dtype, coeffs.dtype))
        return linrec_call(inputs, coeffs, *args, **kwargs)

    monkeypatch.setattr(linrec.nn, "linrec", spy)
    layer, _, state_dtype = make(kind, device, dtype)
    y, state = layer(random_values((BATCH, TIME, IN), dtype, device))
    assert calls == [(torch.complex64, torch.complex64) if kind == "lru" else (dtype, torch.float32)]
    assert y.dtype == dtype and state.dtype == state_dtype


@pytest.mark.parametrize("kind", list(KINDS))
def test_empty_sequence_keeps_the_state(seed, kind):
    layer, state_size, state_dtype = make(kind, "cpu", torch.float32)
    x = torch.randn(2, 0, IN)
    y, state = layer(x)
    assert y.shape == (2, 0, HIDDEN if kind == "mingru" else IN)
    assert state.shape == (2, state_size) and state.dtype == state_dtype and not state.any()
    initial = random_values((2, state_size), state_dtype)
    assert torch.equal(layer(x, initial)[1], initial)


# --- initialization -----------------------------------------------------------------------------------------


def test_ema_initial_decays():
    decay = EMA(6, min_decay=0.5, max_decay=0.99).decay.detach().double()
    time_constants = 1 / (1 - decay)
    torch.testing.assert_close(time_constants, torch.logspace(math.log10(2), 2, 6, dtype=torch.float64), rtol=1e-5, atol=0)


def test_lru_initialization(seed):
    lru = LRU(8, 500, r_min=0.4, r_max=0.9, max_phase=math.pi / 10)
    lam = lru.eigenvalues.detach().to(torch.complex128)
    assert lam.abs().min() >= 0.4 - 1e-6 and lam.abs().max() <= 0.9 + 1e-6
    assert lam.angle().min() >= 0 and lam.angle().max() <= math.pi / 10 + 1e-6
    torch.testing.assert_close(lru.gamma_log.exp().double(), (1 - lam.abs() ** 2).sqrt(), rtol=1e-5, atol=0)
    # |lambda|^2 uniform on [r_min^2, r_max^2]: its mean is the middle
    assert abs((lam.abs() ** 2).mean().item() - (0.16 + 0.81) / 2) < 0.05


def test_docstring_examples():
    results = doctest.testmod(linrec.nn, extraglobs={"linrec": linrec, "torch": torch}, verbose=False)
    assert results.attempted > 0 and results.failed == 0


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_bad_inputs(kind):
    layer, state_size, state_dtype = make(kind, "cpu", torch.float32)
    size = "channels" if kind == "ema" else "input_size"
    x = torch.randn(3, 4, IN)
    state = torch.zeros(3, state_size, dtype=state_dtype)
    with pytest.raises(ValueError, match=rf"x must be a 3-dim tensor \(batch, time, {size}\), got a 2-dim tensor of shape \[4, {IN}\]"):
        layer(x[0])
    with pytest.raises(ValueError, match=rf"x must have {size}={IN} in its last dim, got shape \[3, 4, 4\]"):
        layer(x[..., :4])
    with pytest.raises(TypeError, match=r"x must be torch.float32, torch.float64, torch.bfloat16 or torch.float16, got torch.int64"):
        layer(x.long())
    with pytest.raises(ValueError, match=r"x must be on the device of the layer's parameters \(cpu\), got meta"):
        layer(x.to("meta"))
    with pytest.raises(ValueError, match=rf"state must have shape \[3, {state_size}\] \(batch, \w+\), got \[2, {state_size}\]"):
        layer(x, state[:2])
    wrong = torch.float64 if kind != "lru" else torch.complex128
    with pytest.raises(TypeError, match=rf"state must have dtype {state_dtype} \(for inputs of this dtype\), got {wrong}"):
        layer(x, state.to(wrong))
    with pytest.raises(ValueError, match=r"state must be on the device of the inputs \(cpu\), got meta"):
        layer(x, state.to("meta"))
    with pytest.raises(TypeError, match=r"state must be a torch.Tensor or None, got list"):
        layer(x, [0.0])
    with pytest.raises(ValueError, match=rf"x_t must be a 2-dim tensor \(batch, {size}\), got a 3-dim tensor"):
        layer.step(x)
    with pytest.raises(ValueError, match=rf"state must have shape \[3, {state_size}\]"):
        layer.step(x[:, 0], state[:, :1])


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"EMA: need 0 < min_decay <= max_decay < 1, got min_decay=0.9, max_decay=0.5"):
        EMA(4, min_decay=0.9, max_decay=0.5)
    with pytest.raises(ValueError, match=r"EMA: channels must be a positive int, got 0"):
        EMA(0)
    with pytest.raises(ValueError, match=r"MinGRU: hidden_size must be a positive int, got -1"):
        MinGRU(4, -1)
    with pytest.raises(ValueError, match=r"LRU: need 0 <= r_min < r_max <= 1, got r_min=0.9, r_max=0.5"):
        LRU(4, 8, r_min=0.9, r_max=0.5)
    with pytest.raises(ValueError, match=r"LRU: max_phase must be positive, got 0"):
        LRU(4, 8, max_phase=0)
