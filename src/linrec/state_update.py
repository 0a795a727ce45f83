"""The decode step of Mamba's selective scan: one step of the recurrence, the state updated in place, with the
arguments of mamba_ssm's ``selective_state_update``.

The op (``torch.ops.linrec.selective_state_update``) runs the scan's arithmetic for one step, on the operands
the scan would take (``_core.selective_scan.fused_operands``), so that T steps give the bits of one scan of T
steps wherever that scan walks time step by step: on the CPU always, and on the GPU where the fused scan runs its lane
kernels (a real float32 state, n <= 128, B and C varying with the same groups) on rows it does not split along
time (docs/design.md, Fused selective scan).
"""

from __future__ import annotations

import torch

from ._core.checks import (
    INDEX_DTYPES,
    REAL_DTYPES,
    as_bool,
    check_cache_row_values,
    check_device,
    check_dtype,
    check_tensor,
)
from ._core.selective_scan import compute_dtypes, fused_operands
from .ssm import selective_scan

__all__ = ["selective_state_update"]

_OP = "linrec.selective_state_update"


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
    """One step of Mamba's selective scan for decoding: updates ``state`` in place and returns the step's output.

    With ``dt`` shifted by ``dt_bias`` and passed through softplus when ``dt_softplus``, for every batch row
    (elementwise over the channels and state dims)::

        state = exp(dt * A) * state + dt * B * x
        out = sum over n of state * C + D * x         (the D term only when given)
        out = out * silu(z)                           (when z is given)

    Two layouts, as mamba_ssm's ``selective_state_update`` takes them:

    - Mamba-1: ``state`` (batch, d, n), ``x``, ``dt`` and ``z`` (batch, d), ``A`` (d, n), ``B`` and ``C``
      (batch, n) or (batch, groups, n), ``D`` and ``dt_bias`` (d,);
    - Mamba-2's heads: ``state`` (batch, heads, head_dim, n), ``x``, ``dt`` and ``z`` (batch, heads, head_dim),
      ``A`` (heads, head_dim, n) (a scalar per head expanded, as Mamba-2 passes it, or any values), ``B`` and
      ``C`` (batch, groups, n) with ``groups`` dividing ``heads``, ``D`` and ``dt_bias`` (heads, head_dim).

    The step computes as ``linrec.selective_scan`` does (float32 at least, the state in float32; float64
    arguments in float64; a complex ``A`` gives a complex state) and writes the new state back in ``state``'s
    dtype. T steps from a state give the same bits as one ``linrec.selective_scan`` call of those T steps
    from it (``initial``, ``return_last_state``): its outputs and its last state. That holds on the CPU, and
    on the GPU where the scan runs its lane kernels (B and C varying with the same groups, n <= 128, a real
    float32 state) over rows of at most 512 steps, or rows it does not split along time (many channels); a
    scan of few long rows otherwise splits them and agrees with the steps to rounding.

    Args:
        state: the state, (batch, d, n) or (batch, heads, head_dim, n); with ``state_batch_indices``, a cache
            of state rows (slots, ...) of which each batch row reads and writes one. Float32, float64,
            16-bit, or complex with a complex ``A``. Updated in place.
        x: the step's inputs, (batch, d) or (batch, heads, head_dim).
        dt: the step sizes, shaped as ``x``.
        A: (d, n) or (heads, head_dim, n), real or complex.
        B: (batch, n), or (batch, groups, n) with groups dividing d (heads in the heads layout).
        C: as ``B``.
        D: the skip connection, (d,) or (heads, head_dim), or None.
        z: the gate, shaped as ``x``, or None.
        dt_bias: added to ``dt`` before the softplus, (d,) or (heads, head_dim), or None.
        dt_softplus: pass ``dt`` (after ``dt_bias``) through softplus.
        state_batch_indices: int32 or int64 (batch,): the state row of each batch row (continuous batching),
            distinct; a negative index marks a padded batch row, which starts from a zero state and whose new
            state is dropped. None: batch row b takes state row b. Eager calls check the values (one read on
            the host); under torch.compile or CUDA graph capture they are not read, and an index past the
            state's rows counts as padded.

    Returns:
        The output, shaped as ``x``, in ``x``'s dtype.

    Example:
        >>> batch, d, n = 2, 8, 4
        >>> state = torch.zeros(batch, d, n)
        >>> A = -torch.rand(d, n)
        >>> for _ in range(3):
        ...     x, dt = torch.randn(batch, d), torch.rand(batch, d)
        ...     B, C = torch.randn(batch, n), torch.randn(batch, n)
        ...     out = selective_state_update(state, x, dt, A, B, C)
        >>> out.shape
        torch.Size([2, 8])
    """
    dt_softplus = as_bool(_OP, "dt_softplus", dt_softplus)
    batch, d, n = _check(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    # Mamba-1's layout, one step long: (batch, d, 1) per step, B and C (batch, groups, n, 1).
    u, delta, gate = (None if t is None else t.reshape(batch, d, 1) for t in (x, dt, z))
    A = A.reshape(d, n)
    D, dt_bias = (None if t is None else t.reshape(d) for t in (D, dt_bias))
    B, C = _projection(B, A), _projection(C, A)
    # A strided state is scanned in a contiguous copy, written back below.
    rows = (state if state.is_contiguous() else state.contiguous()).view(state.shape[0], d, n)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (rows, u, delta, A, B, C, D, gate, dt_bias)):
        out = _differentiable_step(rows, u, delta, A, B, C, D, gate, dt_bias, dt_softplus, state_batch_indices)
    else:
        real_dtype, state_dtype = compute_dtypes(u, delta, A, B, C, D, gate, dt_bias, rows)
        operands = fused_operands(u, delta, A, B, C, D, gate, dt_bias, None, real_dtype, state_dtype)
        states = rows if rows.dtype == state_dtype else rows.to(state_dtype)
        indices = None if state_batch_indices is None else state_batch_indices.contiguous()
        out = torch.ops.linrec.selective_state_update(states, *operands[:8], dt_softplus, indices)
        if states is not rows:
            rows.copy_(states)
    if not state.is_contiguous():  # rows is a contiguous copy
        state.copy_(rows.view(state.shape))
    out = out.view(x.shape)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _projection(M: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """B or C of one step as the scan takes a varying one: (batch, groups, n, 1), complex beside a complex A."""
    if A.is_complex() and not M.is_complex():
        M = M.to(A.dtype)
    return (M if M.dim() == 3 else M.unsqueeze(1)).unsqueeze(-1)


def _differentiable_step(rows, u, delta, A, B, C, D, z, dt_bias, dt_softplus, indices) -> torch.Tensor:
    """The step as linrec.selective_scan of length 1, whose derivatives autograd takes (the op updates the
    state in place and has none): the same values as the op."""
    if indices is None:
        initial = rows.clone()  # the scan saves it for the backward; rows is overwritten below
    else:
        padded = (indices < 0) | (indices >= rows.shape[0])
        initial = rows[indices.clamp(0, rows.shape[0] - 1).long()].masked_fill(padded.view(-1, 1, 1), 0)
    out, last_state = selective_scan(u, delta, A, B, C, D, z, dt_bias, dt_softplus, return_last_state=True,
                                     initial=initial)
    if indices is None:
        rows.copy_(last_state)
    else:
        kept = ~padded
        rows.index_copy_(0, indices[kept].long(), last_state[kept].to(rows.dtype))
    return out


def _shape(tensor: torch.Tensor) -> str:
    return str(list(tensor.shape))


def _check(state, x, dt, A, B, C, D, z, dt_bias, indices) -> tuple[int, int, int]:
    """Checks every argument of either layout; returns (batch, d, n) of the flattened channels. Raises TypeError
    (types, dtypes) or ValueError (shapes, devices, index values) naming the argument."""
    named = {"state": state, "x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
             "state_batch_indices": indices}
    for name, tensor in named.items():
        check_tensor(_OP, name, tensor, or_none=name in ("D", "z", "dt_bias", "state_batch_indices"))
    complex_types = (torch.complex64, torch.complex128)
    for name, tensor in named.items():
        if tensor is None:
            continue
        check_device(_OP, name, tensor, "x", x.device)
        if name == "state_batch_indices":
            check_dtype(_OP, name, tensor, INDEX_DTYPES)
        elif name in ("state", "A", "B", "C"):
            check_dtype(_OP, name, tensor, REAL_DTYPES + complex_types, "a real or complex floating-point tensor")
        else:
            check_dtype(_OP, name, tensor, REAL_DTYPES, "a real floating-point tensor")
    if A.is_complex() and not state.is_complex():
        raise TypeError(f"{_OP}: A is complex ({A.dtype}), so the state is: state must be complex, got {state.dtype}")
    for name in ("state", "B", "C"):
        if named[name].is_complex() and not A.is_complex():
            raise TypeError(f"{_OP}: {name} is complex ({named[name].dtype}) but A is real ({A.dtype}): a complex "
                            f"{name} needs a complex A")

    if state.dim() not in (3, 4):
        raise ValueError(f"{_OP}: state must be (batch, d, n) or, in Mamba-2's heads layout, (batch, heads, "
                         f"head_dim, n), got shape {_shape(state)}")
    heads_layout = state.dim() == 4
    channels = tuple(state.shape[1:-1])  # (d,) or (heads, head_dim)
    n = state.shape[-1]
    layout = "(batch, heads, head_dim)" if heads_layout else "(batch, d)"
    if x.dim() != len(channels) + 1 or tuple(x.shape[1:]) != channels:
        raise ValueError(f"{_OP}: x must be {layout} = [batch, {', '.join(map(str, channels))}] as state "
                         f"{_shape(state)} holds its channels, got {_shape(x)}")
    batch = x.shape[0]
    for name in ("dt", "z"):
        if named[name] is not None and named[name].shape != x.shape:
            raise ValueError(f"{_OP}: {name} must have the shape of x {layout} = {_shape(x)}, got "
                             f"{_shape(named[name])}")
    if tuple(A.shape) != (*channels, n):
        raise ValueError(f"{_OP}: A must be {'(heads, head_dim, n)' if heads_layout else '(d, n)'} = "
                         f"{[*channels, n]}, got {_shape(A)}")
    for name in ("D", "dt_bias"):
        if named[name] is not None and tuple(named[name].shape) != channels:
            raise ValueError(f"{_OP}: {name} must be {'(heads, head_dim)' if heads_layout else '(d,)'} = "
                             f"{list(channels)}, got {_shape(named[name])}")
    for name, M in (("B", B), ("C", C)):
        if M.dim() == 2 and not heads_layout:
            if tuple(M.shape) != (batch, n):
                raise ValueError(f"{_OP}: {name} must be (batch, n) = {[batch, n]} or (batch, groups, n), got "
                                 f"{_shape(M)}")
            continue
        groups = M.shape[1] if M.dim() == 3 else 0
        if M.dim() != 3 or M.shape[0] != batch or M.shape[2] != n or groups == 0 or channels[0] % groups != 0:
            what = "heads" if heads_layout else "d"
            raise ValueError(f"{_OP}: {name} must be (batch, groups, n) = [{batch}, groups, {n}] with groups "
                             f"dividing {what} = {channels[0]}{'' if heads_layout else ', or (batch, n)'}, got "
                             f"{_shape(M)}")

    slots = state.shape[0]
    if indices is None:
        if slots != batch:
            raise ValueError(f"{_OP}: state must hold a row per batch row ({batch}, x's dim 0) without "
                             f"state_batch_indices, got {slots}")
    else:
        if indices.shape != (batch,):
            raise ValueError(f"{_OP}: state_batch_indices must be (batch,) = [{batch}], got {_shape(indices)}")
        check_cache_row_values(_OP, "state_batch_indices", indices, "state", slots)
    d = 1
    for size in channels:
        d *= size
    return batch, d, n

