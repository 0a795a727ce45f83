"""Recurrent layers built on :func:`linrec.linrec`: :class:`EMA`, :class:`MinGRU` and :class:`LRU`.

Each layer takes ``x`` of shape (batch, time, channels) and runs its recurrence over the whole sequence
in one ``linrec`` call along dim 1. All share one interface:

- ``y, state = layer(x, state=None)``: ``state`` is the recurrent state before the first step (``None``
  means zeros); the returned ``state`` is the state after the last step. Passing it to the next call
  continues the sequence exactly, so a long sequence can be trained in chunks or streamed. It stays in
  the autograd graph: ``state.detach()`` it between chunks for truncated backpropagation through time.
- ``y_t, state = layer.step(x_t, state=None)``: one time step on ``x_t`` of shape (batch, channels),
  for autoregressive generation; stepping through a sequence gives the outputs of one full call.

Bad arguments raise TypeError (a wrong type or dtype) or ValueError (a wrong value, shape or device),
their messages starting with the layer's name (``linrec.nn.MinGRU: ...``), as everywhere in linrec.

16-bit inputs (float16, bfloat16): the layers compute their decays in float32 and pass them to
``linrec`` in float32, since bfloat16 stores a decay of 0.999 as 1.0 (no forgetting at all); the
terms the decays multiply, the outputs and the state stay in the dtype of ``x`` (LRU: complex64, as
``linrec`` has no 16-bit complex type). An EMA or MinGRU state is then 16-bit, so a sequence continued
in chunks rounds it to 16 bits at each chunk boundary, where one call carries it in float32: the
outputs agree with one call's up to those roundings, which long memories (decays near 1) accumulate.

Example:
    >>> import torch, linrec
    >>> layer = linrec.nn.MinGRU(16, 32)
    >>> x = torch.randn(4, 100, 16)                     # (batch, time, input_size)
    >>> y, state = layer(x)                             # y: (4, 100, 32), state: (4, 32)
    >>> y1, s1 = layer(x[:, :60])                       # the same sequence in two chunks
    >>> y2, s2 = layer(x[:, 60:], s1)
    >>> torch.allclose(torch.cat([y1, y2], 1), y, atol=1e-6)
    True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._core.checks import as_positive_int, check_device, check_dtype, check_tensor
from .reference import compute_dtype
from .scan import final_states, linrec

__all__ = ["EMA", "LRU", "MinGRU"]

# The layers' names in their messages.
_EMA, _MIN_GRU, _LRU = "linrec.nn.EMA", "linrec.nn.MinGRU", "linrec.nn.LRU"

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


# --- argument checks -------------------------------------------------------------------------------------


def _check_x(layer: str, name: str, x: object, dims: str, size_name: str, size: int, device: torch.device) -> None:
    """``x`` must be a floating tensor of ``len(dims)`` dims, its last of ``size``, on ``device``."""
    check_tensor(layer, name, x)
    ndim = dims.count(",") + 1
    if x.dim() != ndim:
        raise ValueError(
            f"{layer}: {name} must be a {ndim}-dim tensor ({dims}), got a {x.dim()}-dim tensor of shape {list(x.shape)}"
        )
    if x.shape[-1] != size:
        raise ValueError(
            f"{layer}: {name} must have {size_name}={size} in its last dim, got shape {list(x.shape)}"
        )
    check_dtype(layer, name, x, _FLOAT_DTYPES)
    check_device(layer, name, x, "the layer's parameters", device)


def _check_state(layer: str, state: object, shape: tuple[int, ...], what: str, dtype: torch.dtype,
                 device: torch.device) -> None:
    """``state`` must be a tensor of ``shape`` (described by ``what``), ``dtype`` and ``device``."""
    check_tensor(layer, "state", state, or_none=True)
    if tuple(state.shape) != tuple(shape):
        raise ValueError(f"{layer}: state must have shape {list(shape)} ({what}), got {list(state.shape)}")
    if state.dtype != dtype:
        raise TypeError(f"{layer}: state must have dtype {dtype} (for inputs of this dtype), got {state.dtype}")
    check_device(layer, "state", state, "the inputs", device)


def _wide_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The widest of ``dtypes``: parameter-derived terms are computed in it, then rounded to the input dtype."""
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return result


def _scan_step(coeffs: torch.Tensor, state: torch.Tensor | None, inputs: torch.Tensor,
               log_coeffs: bool = False) -> torch.Tensor:
    """``coeffs * state + inputs`` as the kernels compute one position: 16-bit types in float32, the
    result rounded to the dtype of ``inputs``."""
    dtype = inputs.dtype
    compute = compute_dtype(dtype)
    inputs = inputs.to(compute)
    if state is None:
        return inputs.to(dtype)
    coeffs = coeffs.to(compute)
    if log_coeffs:
        coeffs = coeffs.exp()
    return (coeffs * state.to(compute) + inputs).to(dtype)


# --- EMA ---------------------------------------------------------------------------------------------------


class EMA(nn.Module):
    """Exponential moving average with a learnable decay per channel.

    ``y[t] = a * y[t-1] + (1 - a) * x[t]`` with ``a = sigmoid(decay_logit)`` in (0, 1), one per channel.
    The recurrence runs in log space (``log a = logsigmoid(decay_logit)``, passed with
    ``log_coeffs=True``), and ``log a`` goes to ``linrec`` in float32 for 16-bit inputs (in the dtype of
    ``x`` otherwise), which keeps decays near 1 accurate.

    Args:
        channels: the number of channels C.
        min_decay: the initial decay of channel 0; the initial decays span ``min_decay`` to ``max_decay``,
            with time constants ``1 / (1 - a)`` log-spaced from ``1 / (1 - min_decay)`` (channel 0) to
            ``1 / (1 - max_decay)`` (the last channel); defaults 0.5 to 0.99, i.e. 2 to 100 steps.
        max_decay: the initial decay of the last channel.
        device: of the parameter.
        dtype: of the parameter.

    Shapes:
        x: (batch, time, C), float32, float64, bfloat16 or float16; the layer computes in the dtype of
        ``x`` (parameters are cast to it; 16-bit recurrences accumulate in float32), bar the decays:
        float32 for 16-bit ``x``.
        state: (batch, C) of the dtype of ``x`` (16-bit for 16-bit ``x``): ``y[-1]`` of the previous
        chunk; None means zeros.
        Returns ``(y, new_state)``: y (batch, time, C) and new_state = ``y[:, -1]`` (batch, C).

    Example:
        >>> ema = linrec.nn.EMA(8)
        >>> y, state = ema(torch.randn(2, 50, 8))
        >>> y_next, state = ema.step(torch.randn(2, 8), state)   # one more step
    """

    def __init__(self, channels: int, min_decay: float = 0.5, max_decay: float = 0.99, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        channels = as_positive_int(_EMA, "channels", channels)
        if not 0.0 < min_decay <= max_decay < 1.0:
            raise ValueError(
                f"{_EMA}: need 0 < min_decay <= max_decay < 1, got min_decay={min_decay}, max_decay={max_decay}"
            )
        self.channels = channels
        self.min_decay, self.max_decay = min_decay, max_decay
        self.decay_logit = nn.Parameter(torch.empty(channels, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Decays with log-spaced time constants between those of ``min_decay`` and ``max_decay``."""
        log_one_minus = torch.linspace(math.log1p(-self.min_decay), math.log1p(-self.max_decay), self.channels,
                                       dtype=torch.float64)
        one_minus = log_one_minus.exp()
        with torch.no_grad():
            self.decay_logit.copy_(torch.log1p(-one_minus) - log_one_minus)  # logit(1 - one_minus)

    @property
    def decay(self) -> torch.Tensor:
        """The decays ``a`` (C,), in (0, 1)."""
        return torch.sigmoid(self.decay_logit)

    def _terms(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log a, 1 - a)`` for inputs of ``dtype``: ``log a`` in float32 for 16-bit ``dtype`` (the dtype
        the kernels compute in, so the decays are not rounded to 16 bits), else in ``dtype``; ``1 - a``,
        which scales the inputs, in ``dtype``. Both are computed in the widest of these and the
        parameter's dtype."""
        coeff_dtype = compute_dtype(dtype)
        logit = self.decay_logit.to(_wide_dtype(self.decay_logit.dtype, coeff_dtype))
        return F.logsigmoid(logit).to(coeff_dtype), torch.sigmoid(-logit).to(dtype)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Averages ``x`` (batch, time, C) over time, from ``state`` (batch, C) or zeros; returns
        ``(y, new_state)``."""
        _check_x(_EMA, "x", x, "batch, time, channels", "channels", self.channels, self.decay_logit.device)
        if state is not None:
            _check_state(_EMA, state, (x.shape[0], self.channels), "batch, channels", x.dtype, x.device)
        log_a, one_minus_a = self._terms(x.dtype)
        y = linrec(one_minus_a * x, log_a, dim=1, initial=state, log_coeffs=True)
        return y, final_states(y, None, dim=1, reverse=False, initial=state)

    def step(self, x_t: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: ``x_t`` (batch, C) and ``state`` (batch, C) or None; returns ``(y_t, y_t)``."""
        _check_x(_EMA, "x_t", x_t, "batch, channels", "channels", self.channels, self.decay_logit.device)
        if state is not None:
            _check_state(_EMA, state, (x_t.shape[0], self.channels), "batch, channels", x_t.dtype, x_t.device)
        log_a, one_minus_a = self._terms(x_t.dtype)
        y = _scan_step(log_a, state, one_minus_a * x_t, log_coeffs=True)
        return y, y

    def extra_repr(self) -> str:
        return f"{self.channels}"


# --- MinGRU ------------------------------------------------------------------------------------------------


def _positive_activation(v: torch.Tensor) -> torch.Tensor:
    """minGRU's g: ``v + 0.5`` for ``v >= 0``, ``sigmoid(v)`` below; positive, continuous at 0."""
    return torch.where(v >= 0, v + 0.5, torch.sigmoid(v))


class MinGRU(nn.Module):
    """The minimal GRU of Feng et al., "Were RNNs All We Needed?" (2024), in its log-space form.

    ``z[t] = sigmoid(k[t])``, ``h~[t] = g(v[t])`` with ``(k[t], v[t])`` two linear maps of ``x[t]`` and
    ``g(v) = v + 0.5`` for ``v >= 0``, ``sigmoid(v)`` otherwise; then
    ``h[t] = (1 - z[t]) * h[t-1] + z[t] * h~[t]``. The gates depend on ``x`` only, so the whole sequence is
    one linear recurrence; its coefficients go to ``linrec`` as ``log(1 - z) = -softplus(k)``
    (``log_coeffs=True``), accurate where ``z`` is tiny (long memory), computed from ``k`` in float32
    for 16-bit inputs.

    Args:
        input_size: the channels of ``x``.
        hidden_size: the channels of ``h`` (the outputs and the state).
        bias: whether the linear maps have a bias.
        device: of the parameters.
        dtype: of the parameters.

    Attributes:
        proj: one ``nn.Linear(input_size, 2 * hidden_size)``; its first ``hidden_size`` outputs are the
            gate pre-activations ``k``, the others the candidate pre-activations ``v``.

    Shapes:
        x: (batch, time, input_size), float32, float64, bfloat16 or float16; the layer computes in the
        dtype of ``x`` (parameters are cast to it, so a float32 layer takes bfloat16 inputs), bar the
        log-decays ``-softplus(k)``: float32 for 16-bit ``x``.
        state: (batch, hidden_size) of the dtype of ``x`` (16-bit for 16-bit ``x``), ``h`` before the
        first step; None means zeros.
        Returns ``(h, new_state)``: h (batch, time, hidden_size) and new_state = ``h[:, -1]``.

    Example:
        >>> gru = linrec.nn.MinGRU(16, 32)
        >>> h, state = gru(torch.randn(4, 100, 16))             # (4, 100, 32), (4, 32)
        >>> h_next, state = gru.step(torch.randn(4, 16), state)  # (4, 32): generation, one step at a time
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        input_size = as_positive_int(_MIN_GRU, "input_size", input_size)
        hidden_size = as_positive_int(_MIN_GRU, "hidden_size", hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.proj = nn.Linear(input_size, 2 * hidden_size, bias=bias, device=device, dtype=dtype)

    def _terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log(1 - z), z * h~)`` of the shape of ``x`` with ``hidden_size`` channels: ``z * h~`` in the
        dtype of ``x``, ``log(1 - z)`` in float32 for 16-bit ``x`` (from the projection's 16-bit ``k``, in
        the dtype the kernels compute in, so the decays are not rounded to 16 bits), else in the dtype of
        ``x``."""
        weight = self.proj.weight.to(x.dtype)
        bias = None if self.proj.bias is None else self.proj.bias.to(x.dtype)
        k, v = F.linear(x, weight, bias).chunk(2, dim=-1)
        coeff_dtype = compute_dtype(x.dtype)
        log_coeffs = -F.softplus(k.to(coeff_dtype))
        inputs = torch.sigmoid(k) * _positive_activation(v)
        return log_coeffs.to(coeff_dtype), inputs.to(x.dtype)  # these dtypes under autocast too

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs over ``x`` (batch, time, input_size) from ``state`` (batch, hidden_size) or zeros; returns
        ``(h, new_state)``."""
        _check_x(_MIN_GRU, "x", x, "batch, time, input_size", "input_size", self.input_size, self.proj.weight.device)
        if state is not None:
            _check_state(_MIN_GRU, state, (x.shape[0], self.hidden_size), "batch, hidden_size", x.dtype, x.device)
        log_coeffs, inputs = self._terms(x)
        h = linrec(inputs, log_coeffs, dim=1, initial=state, log_coeffs=True)
        return h, final_states(h, None, dim=1, reverse=False, initial=state)

    def step(self, x_t: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: ``x_t`` (batch, input_size) and ``state`` (batch, hidden_size) or None; returns
        ``(h_t, h_t)``."""
        _check_x(_MIN_GRU, "x_t", x_t, "batch, input_size", "input_size", self.input_size, self.proj.weight.device)
        if state is not None:
            _check_state(_MIN_GRU, state, (x_t.shape[0], self.hidden_size), "batch, hidden_size", x_t.dtype,
                         x_t.device)
        log_coeffs, inputs = self._terms(x_t)
        h = _scan_step(log_coeffs, state, inputs, log_coeffs=True)
        return h, h

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


# --- LRU ---------------------------------------------------------------------------------------------------


class LRU(nn.Module):
    """The Linear Recurrent Unit of Orvieto et al., "Resurrecting Recurrent Neural Networks for Long
    Sequences" (2023).

    A complex diagonal recurrence ``h[t] = lambda * h[t-1] + gamma * (B x[t])`` with output
    ``y[t] = Re(C h[t]) + D * x[t]``, where ``lambda = exp(-exp(nu_log) + i exp(theta_log))`` (one per
    state channel, so ``|lambda| < 1`` always) and ``gamma = exp(gamma_log)``. As in the paper,
    ``gamma_log`` is a learnable parameter initialized to ``log(sqrt(1 - |lambda|^2))`` (the normalization
    that keeps ``h`` of the scale of ``B x`` at initialization), and ``lambda`` is initialized uniformly on
    the ring ``r_min <= |lambda| <= r_max`` with phases in ``[0, max_phase]``. ``B`` (state_size,
    input_size) and ``C`` (input_size, state_size) are complex, stored as real and imaginary parts,
    initialized ~ N(0, 1 / (2 input_size)) and N(0, 1 / state_size) per part; ``D`` (input_size,) ~ N(0, 1).
    The recurrence runs through ``linrec`` in complex64 (complex128 for float64 inputs), 16-bit inputs
    included: its decays ``lambda``, inputs and state are complex64 for them.

    Args:
        input_size: the channels H of ``x`` and of ``y``.
        state_size: the complex state channels N.
        r_min: the inner radius of the ring of the initial ``|lambda|``, ``0 <= r_min < r_max <= 1``; the
            defaults are the paper's generic ones, its long-range experiments use e.g. 0.9 and 0.999.
        r_max: the outer radius of that ring.
        max_phase: the initial phases of ``lambda`` are uniform in ``[0, max_phase]`` (the paper uses
            2 pi, and smaller values such as pi / 10 for long-range tasks).
        device: of the (real) parameters.
        dtype: of the (real) parameters.

    Shapes:
        x: (batch, time, H), float32, float64, bfloat16 or float16; y comes back in the dtype of ``x``.
        state: (batch, N) complex64 (complex128 for float64 inputs or parameters): ``h`` before the first
        step; None means zeros. Returns ``(y, new_state)``: y (batch, time, H) and new_state = ``h[:, -1]``,
        the complex hidden state (not the output).

    Example:
        >>> lru = linrec.nn.LRU(16, 64)
        >>> y, state = lru(torch.randn(4, 100, 16))            # (4, 100, 16), complex64 (4, 64)
        >>> y_next, state = lru.step(torch.randn(4, 16), state)
    """

    def __init__(self, input_size: int, state_size: int, r_min: float = 0.0, r_max: float = 1.0,
                 max_phase: float = 2 * math.pi, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        input_size = as_positive_int(_LRU, "input_size", input_size)
        state_size = as_positive_int(_LRU, "state_size", state_size)
        if not 0.0 <= r_min < r_max <= 1.0:
            raise ValueError(f"{_LRU}: need 0 <= r_min < r_max <= 1, got r_min={r_min}, r_max={r_max}")
        if not max_phase > 0:
            raise ValueError(f"{_LRU}: max_phase must be positive, got {max_phase}")
        self.input_size, self.state_size = input_size, state_size
        self.r_min, self.r_max, self.max_phase = r_min, r_max, max_phase
        factory = dict(device=device, dtype=dtype)
        self.nu_log = nn.Parameter(torch.empty(state_size, **factory))
        self.theta_log = nn.Parameter(torch.empty(state_size, **factory))
        self.gamma_log = nn.Parameter(torch.empty(state_size, **factory))
        self.B_re = nn.Parameter(torch.empty(state_size, input_size, **factory))
        self.B_im = nn.Parameter(torch.empty(state_size, input_size, **factory))
        self.C_re = nn.Parameter(torch.empty(input_size, state_size, **factory))
        self.C_im = nn.Parameter(torch.empty(input_size, state_size, **factory))
        self.D = nn.Parameter(torch.empty(input_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's initialization: ``lambda`` uniform on the ring, ``gamma`` normalizing, B, C, D Gaussian."""
        n, h = self.state_size, self.input_size
        tiny = 1e-12  # keeps the logs finite where a uniform draw is exactly 0
        u1 = torch.rand(n, dtype=torch.float64)
        u2 = torch.rand(n, dtype=torch.float64)
        radius_sq = (u1 * (self.r_max**2 - self.r_min**2) + self.r_min**2).clamp(tiny, 1 - tiny)
        nu = -0.5 * torch.log(radius_sq)  # |lambda| = exp(-nu)
        with torch.no_grad():
            self.nu_log.copy_(nu.log())
            self.theta_log.copy_((self.max_phase * u2).clamp_min(tiny).log())
            self.gamma_log.copy_(0.5 * torch.log1p(-radius_sq))  # log sqrt(1 - |lambda|^2)
            self.B_re.copy_(torch.randn(n, h, dtype=torch.float64) / math.sqrt(2 * h))
            self.B_im.copy_(torch.randn(n, h, dtype=torch.float64) / math.sqrt(2 * h))
            self.C_re.copy_(torch.randn(h, n, dtype=torch.float64) / math.sqrt(n))
            self.C_im.copy_(torch.randn(h, n, dtype=torch.float64) / math.sqrt(n))
            self.D.copy_(torch.randn(h, dtype=torch.float64))

    def state_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The complex dtype of the state (and of the recurrence) for inputs of ``dtype``."""
        return _wide_dtype(self.nu_log.dtype, dtype, torch.float32).to_complex()

    @property
    def eigenvalues(self) -> torch.Tensor:
        """``lambda`` (state_size,), complex."""
        return torch.exp(torch.complex(-self.nu_log.exp(), self.theta_log.exp()))

    def _weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """In the real dtype of the recurrence: ``lambda`` (N,), ``gamma B`` as (2N, H) with rows alternating
        real and imaginary parts, and ``[Re C, -Im C]`` interleaved as (H, 2N)."""
        real = self.state_dtype(dtype).to_real()
        nu, theta = self.nu_log.to(real).exp(), self.theta_log.to(real).exp()
        lam = torch.exp(torch.complex(-nu, theta))
        gamma = self.gamma_log.to(real).exp().unsqueeze(1)
        gamma_b = torch.stack((gamma * self.B_re.to(real), gamma * self.B_im.to(real)), dim=1).flatten(0, 1)
        c = torch.stack((self.C_re.to(real), -self.C_im.to(real)), dim=2).flatten(1, 2)
        return lam, gamma_b, c

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs over ``x`` (batch, time, input_size) from ``state`` (batch, state_size, complex) or zeros;
        returns ``(y, new_state)``."""
        _check_x(_LRU, "x", x, "batch, time, input_size", "input_size", self.input_size, self.nu_log.device)
        complex_dtype = self.state_dtype(x.dtype)
        if state is not None:
            _check_state(_LRU, state, (x.shape[0], self.state_size), "batch, state_size", complex_dtype, x.device)
        lam, gamma_b, c = self._weights(x.dtype)
        batch, time = x.shape[:2]
        x_wide = x.to(gamma_b.dtype)
        # gamma B x as (batch, time, N, 2) real/imaginary pairs, viewed as complex without a copy
        inputs = torch.view_as_complex((x_wide @ gamma_b.T).view(batch, time, self.state_size, 2))
        h = linrec(inputs, lam, dim=1, initial=state)
        # Re(C h) = Re C Re h - Im C Im h: one real product over the interleaved (Re h, Im h) pairs
        y = torch.view_as_real(h).flatten(2, 3) @ c.T + self.D.to(x_wide.dtype) * x_wide
        return y.to(x.dtype), final_states(h, None, dim=1, reverse=False, initial=state)

    def step(self, x_t: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: ``x_t`` (batch, input_size) and ``state`` (batch, state_size, complex) or None;
        returns ``(y_t, h_t)``."""
        _check_x(_LRU, "x_t", x_t, "batch, input_size", "input_size", self.input_size, self.nu_log.device)
        complex_dtype = self.state_dtype(x_t.dtype)
        if state is not None:
            _check_state(_LRU, state, (x_t.shape[0], self.state_size), "batch, state_size", complex_dtype,
                         x_t.device)
        lam, gamma_b, c = self._weights(x_t.dtype)
        x_wide = x_t.to(gamma_b.dtype)
        inputs = torch.view_as_complex((x_wide @ gamma_b.T).view(x_t.shape[0], self.state_size, 2))
        h = _scan_step(lam, state, inputs)
        y = torch.view_as_real(h).flatten(1, 2) @ c.T + self.D.to(x_wide.dtype) * x_wide
        return y.to(x_t.dtype), h

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.state_size}, r_min={self.r_min}, r_max={self.r_max}, "
                f"max_phase={self.max_phase:.4g}")
