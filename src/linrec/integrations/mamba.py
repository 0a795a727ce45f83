"""mamba_ssm's functions, with its signatures and semantics, on linrec's ops: ``selective_scan_fn`` and
``mamba_inner_fn`` (``mamba_ssm.ops.selective_scan_interface``) and ``selective_state_update``
(``mamba_ssm.ops.triton.selective_state_update``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..conv import causal_conv1d
from ..ssm import selective_scan
from ..state_update import selective_state_update as _state_update

__all__ = ["mamba_inner_fn", "selective_scan_fn", "selective_state_update"]


#: mamba_ssm's ``selective_scan_fn``: :func:`linrec.selective_scan` takes its arguments in its order (and, beyond
#: them, keyword-only ones); its last state is differentiable too.
selective_scan_fn = selective_scan


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """mamba_ssm's ``selective_state_update``: :func:`linrec.selective_state_update`, with mamba_ssm's output of 0
    for a padded batch row (a negative ``state_batch_indices`` entry)."""
    out = _state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    if state_batch_indices is not None:
        padded = (state_batch_indices < 0).view(-1, *([1] * (out.dim() - 1)))
        out = out.masked_fill(padded, 0)
    return out


def mamba_inner_fn(
    xz: torch.Tensor,
    conv1d_weight: torch.Tensor,
    conv1d_bias: torch.Tensor | None,
    x_proj_weight: torch.Tensor,
    delta_proj_weight: torch.Tensor,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    A: torch.Tensor,
    B: torch.Tensor | None = None,
    C: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    B_proj_bias: torch.Tensor | None = None,
    C_proj_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
    checkpoint_lvl: int = 1,
    b_rms_weight: torch.Tensor | None = None,
    c_rms_weight: torch.Tensor | None = None,
    dt_rms_weight: torch.Tensor | None = None,
    b_c_dt_rms_eps: float = 1e-6,
) -> torch.Tensor:
    """mamba_ssm's ``mamba_inner_fn``: a Mamba block from its input projection's output to its output projection.

    ``xz`` (batch, 2 * d, length) splits into x and the gate z; x goes through the causal conv
    (``conv1d_weight`` (d, 1, width), SiLU), then ``x_proj_weight`` (dt_rank + 2 * d_state, d) makes the step
    sizes' low-rank input, B and C (where not given), ``delta_proj_weight`` (d, dt_rank) the step sizes; the
    selective scan runs with D, z, ``delta_bias`` and ``delta_softplus``; ``out_proj_weight`` and
    ``out_proj_bias`` project its output: (batch, length, d_model). B and C are biased by ``B_proj_bias`` and
    ``C_proj_bias``, and the step sizes, B and C normalised (RMS, weights only) by ``dt_rms_weight``,
    ``b_rms_weight`` and ``c_rms_weight`` where given (FalconMamba). Under autocast the projections' weights are
    cast to its dtype. ``checkpoint_lvl`` is accepted (0 or 1) for the signature's sake: autograd keeps what
    the ops save."""
    if checkpoint_lvl not in (0, 1):
        raise ValueError(f"mamba_inner_fn: checkpoint_lvl must be 0 or 1, got {checkpoint_lvl!r}")
    if torch.is_autocast_enabled(xz.device.type):
        dtype = torch.get_autocast_dtype(xz.device.type)
        x_proj_weight, delta_proj_weight, out_proj_weight = (
            w.to(dtype) for w in (x_proj_weight, delta_proj_weight, out_proj_weight))
        out_proj_bias = None if out_proj_bias is None else out_proj_bias.to(dtype)
    batch, _, length = xz.shape
    delta_rank = delta_proj_weight.shape[1]
    d_state = A.shape[-1] * (2 if A.is_complex() else 1)
    x, z = xz.chunk(2, dim=1)
    d = x.shape[1]
    conv_out = causal_conv1d(x, conv1d_weight.reshape(d, -1), conv1d_bias, activation="silu")
    x_dbl = F.linear(conv_out.transpose(1, 2).reshape(batch * length, d), x_proj_weight)  # (batch * length, ...)
    delta = delta_proj_weight @ x_dbl[:, :delta_rank].t()  # (d, batch * length)
    if dt_rms_weight is not None:
        delta = _rms_norm(delta.t(), dt_rms_weight, b_c_dt_rms_eps).t()
    delta = delta.reshape(d, batch, length).transpose(0, 1)
    if B is None:
        B = _varying(x_dbl[:, delta_rank:delta_rank + d_state], B_proj_bias, b_rms_weight, b_c_dt_rms_eps, A, batch)
    if C is None:
        C = _varying(x_dbl[:, x_dbl.shape[1] - d_state:], C_proj_bias, c_rms_weight, b_c_dt_rms_eps, A, batch)
    out = selective_scan(conv_out, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return F.linear(out.transpose(1, 2), out_proj_weight, out_proj_bias)


def _varying(M: torch.Tensor, bias: torch.Tensor | None, rms_weight: torch.Tensor | None, eps: float,
             A: torch.Tensor, batch: int) -> torch.Tensor:
    """B or C from x_proj's output (batch * length, d_state): biased and normalised where asked, laid out as the
    scan takes a varying one, (batch, 1, n, length), or with interleaved (real, imag) pairs along the length
    for a complex A."""
    if bias is not None:
        M = M + bias.to(M.dtype)
    if rms_weight is not None:
        M = _rms_norm(M, rms_weight, eps)
    length = M.shape[0] // batch
    if A.is_complex():  # (b l) (n two) -> b 1 n (l two)
        return M.reshape(batch, length, -1, 2).permute(0, 2, 1, 3).reshape(batch, 1, -1, 2 * length)
    return M.reshape(batch, length, -1).transpose(1, 2).unsqueeze(1)


def _rms_norm(values: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """values (rows, features) over the root mean square of each row, times weight, in float32 at least; the
    result in values' dtype."""
    wide = values.float() if values.dtype in (torch.float16, torch.bfloat16) else values
    normed = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps) * weight.to(wide.dtype)
    return normed.to(values.dtype)
