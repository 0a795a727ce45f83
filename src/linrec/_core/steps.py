"""Moves values one step along the recurrence, within each sequence: the shifts that the derivatives of
the ops need besides the scans themselves (``coeffs[l] * outputs[l-1]`` is where the previous step
enters every formula).

"Previous" and "next" follow the scan's direction (with ``reverse`` the previous step of ``l`` is
``l + 1``), and no value crosses a ``cu_seqlens`` boundary. All of it is plain differentiable torch,
traceable by ``torch.compile`` and batched by ``torch.vmap``; no host synchronization.
"""

from __future__ import annotations

import torch


def _time_mask(mask: torch.Tensor, ndim: int, dim: int) -> torch.Tensor:
    """A (length,) mask viewed along `dim` of an `ndim`-dim tensor, for broadcasting."""
    shape = [1] * ndim
    shape[dim] = mask.shape[0]
    return mask.view(shape)


def _positions(length: int, cu_seqlens: torch.Tensor):
    """For each time step: its index, its packed sequence, and the indices of that sequence's first and
    last steps."""
    steps = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    segment = torch.searchsorted(cu_seqlens, steps, right=True) - 1
    return steps, segment, cu_seqlens[segment], cu_seqlens[segment + 1] - 1


def _shift(values: torch.Tensor, dim: int, toward_end: bool, fill: torch.Tensor | None = None) -> torch.Tensor:
    """`values` moved one step along `dim` (toward its end or its start); the step left free takes `fill`
    (of `values`' shape with size 1 along dim), or zeros."""
    length = values.shape[dim]
    if fill is None:
        fill = values.new_zeros(1).expand([1 if d == dim else size for d, size in enumerate(values.shape)])
    if length == 0:
        return values.clone()
    kept = values.narrow(dim, 0, length - 1) if toward_end else values.narrow(dim, 1, length - 1)
    return torch.cat([fill, kept] if toward_end else [kept, fill], dim)


def previous_step(
    values: torch.Tensor,
    initial: torch.Tensor | None,
    dim: int,
    reverse: bool,
    cu_seqlens: torch.Tensor | None,
) -> torch.Tensor:
    """``values`` at the step before each step of the scan; at each sequence's first step, ``initial``
    (of the shape the ops take it) or zero without one. ``previous_step(outputs, initial)`` is the
    state that each coefficient multiplies; a float32 ``initial`` with 16-bit ``values`` (mixed
    precision) promotes it to float32, which keeps the state exact."""
    if cu_seqlens is None:
        fill = None if initial is None else initial.unsqueeze(dim)
        return _shift(values, dim, toward_end=not reverse, fill=fill)
    shifted = _shift(values, dim, toward_end=not reverse)
    if values.shape[dim] == 0:
        return shifted
    steps, segment, first, last = _positions(values.shape[dim], cu_seqlens)
    starts = _time_mask(steps == (last if reverse else first), values.dim(), dim)
    if initial is None:
        return shifted.masked_fill(starts, 0)
    # initial's dim 0 counts sequences; inputs hold them along dim, behind a batch dim 0 of size 1.
    initial_per_step = initial.index_select(0, segment).movedim(0, dim - 1).unsqueeze(0)
    return torch.where(starts, initial_per_step, shifted)


def next_step(values: torch.Tensor, dim: int, reverse: bool, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """``values`` at the step after each step of the scan; zero at each sequence's last step. The adjoint
    of ``previous_step`` in its ``values`` (``first_step`` is the adjoint in ``initial``)."""
    shifted = _shift(values, dim, toward_end=reverse)
    if cu_seqlens is None or values.shape[dim] == 0:
        return shifted
    steps, _, first, last = _positions(values.shape[dim], cu_seqlens)
    return shifted.masked_fill(_time_mask(steps == (first if reverse else last), values.dim(), dim), 0)


def first_step(values: torch.Tensor, dim: int, reverse: bool, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """``values`` at each sequence's first step of the scan, in the shape of ``initial``: zero for an
    empty sequence."""
    length = values.shape[dim]
    if cu_seqlens is None:
        if length == 0:
            return values.sum(dim)  # zeros of the right shape, in the graph
        return values.select(dim, length - 1 if reverse else 0)
    starts = (cu_seqlens[1:] - 1) if reverse else cu_seqlens[:-1]
    empty = cu_seqlens[1:] == cu_seqlens[:-1]
    if length == 0:
        return values.new_zeros([starts.shape[0], *[s for d, s in enumerate(values.shape) if d not in (0, dim)]])
    picked = values.index_select(dim, starts.clamp(0, length - 1)).squeeze(0).movedim(dim - 1, 0)
    return picked.masked_fill(empty.view([-1] + [1] * (picked.dim() - 1)), 0)
