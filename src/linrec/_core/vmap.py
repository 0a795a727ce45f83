"""Batching rules of the ops for ``torch.vmap`` (and so for ``torch.func``'s jacrev, jacfwd, hessian and
per-sample gradients): the vmapped dim becomes one more batch dim of a single call. The kernels read
every operand through its strides, so moving the vmapped dim, and expanding an operand that is not
vmapped (stride 0), copy nothing.

The vmapped dim goes first, or right after the batch dim of size 1 that packed sequences
(``cu_seqlens``) keep in front. The offsets themselves cannot be vmapped: one call scans one packing.
"""

from __future__ import annotations

import torch

from .checks import check_cu_seqlens_not_vmapped, normalize_dim


def _placement(op: str, ndim: int, dim: int, cu_seqlens: torch.Tensor | None, cu_seqlens_bdim: int | None):
    """Where the vmapped dim goes, and where the time dim then is, for unbatched operands of `ndim` dims."""
    check_cu_seqlens_not_vmapped(op, cu_seqlens_bdim is not None)
    position = 0 if cu_seqlens is None else 1
    time_dim = normalize_dim(op, dim, ndim)
    return position, time_dim + (time_dim >= position)


def _batched(tensor: torch.Tensor | None, bdim: int | None, batch_size: int, position: int) -> torch.Tensor | None:
    """An operand of the inputs' shape (or initial's) with the vmapped dim at `position`: moved there, or
    inserted and expanded with stride 0."""
    if tensor is None:
        return None
    if bdim is None:
        return tensor.unsqueeze(position).expand(*tensor.shape[:position], batch_size, *tensor.shape[position:])
    return tensor.movedim(bdim, position)


def _batched_coeffs(coeffs: torch.Tensor, bdim: int | None, ndim: int, position: int) -> torch.Tensor:
    """coeffs, which broadcast against `ndim`-dim inputs: unbatched ones broadcast as they are; batched ones
    get the leading size-1 dims that broadcasting would add, then the vmapped dim at `position`."""
    if bdim is None:
        return coeffs
    coeffs = coeffs.movedim(bdim, 0)
    coeffs = coeffs.reshape(coeffs.shape[0], *[1] * (ndim + 1 - coeffs.dim()), *coeffs.shape[1:])
    return coeffs.movedim(0, position)


def _coeffs_per_sample(coeffs: torch.Tensor, bdim: int | None, ndim: int, position: int,
                       batch_size: int) -> torch.Tensor:
    """coeffs with the vmapped dim at `position` even when they are not vmapped (expanded, stride 0), so that
    the backward op, which sums d_coeffs over the dims coeffs broadcast along, keeps one sum per sample."""
    if bdim is not None:
        return _batched_coeffs(coeffs, bdim, ndim, position)
    coeffs = coeffs.reshape(*[1] * (ndim - coeffs.dim()), *coeffs.shape)
    return coeffs.unsqueeze(position).expand(*coeffs.shape[:position], batch_size, *coeffs.shape[position:])


def _in_dims(in_dims, count: int) -> tuple:
    # Arguments equal to their schema default may be left out of the call, and of in_dims with them.
    return (*in_dims, *[None] * (count - len(in_dims)))


def _register_vmap(forward: torch._ops.OpOverload, backward: torch._ops.OpOverload) -> None:
    """Registers the batching rules of one family's two ops."""

    def forward_vmap(info, in_dims, inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None,
                     log_coeffs=False, *config):
        inputs_bdim, coeffs_bdim, _, _, initial_bdim, cu_seqlens_bdim, *_ = _in_dims(in_dims, 9)
        ndim = inputs.dim() - (inputs_bdim is not None)
        position, time_dim = _placement("linrec.forward", ndim, dim, cu_seqlens, cu_seqlens_bdim)
        size = info.batch_size
        outputs = forward(
            _batched(inputs, inputs_bdim, size, position), _batched_coeffs(coeffs, coeffs_bdim, ndim, position),
            time_dim, reverse, _batched(initial, initial_bdim, size, position), cu_seqlens, log_coeffs, *config,
        )
        return outputs, position

    def backward_vmap(info, in_dims, d_outputs, coeffs, outputs, dim=-1, reverse=False, initial=None, cu_seqlens=None,
                      log_coeffs=False, *config):
        d_outputs_bdim, coeffs_bdim, outputs_bdim, _, _, initial_bdim, cu_seqlens_bdim, *_ = _in_dims(in_dims, 10)
        ndim = d_outputs.dim() - (d_outputs_bdim is not None)
        position, time_dim = _placement("linrec.backward", ndim, dim, cu_seqlens, cu_seqlens_bdim)
        size = info.batch_size
        d_inputs, d_coeffs, d_initial = backward(
            _batched(d_outputs, d_outputs_bdim, size, position),
            _coeffs_per_sample(coeffs, coeffs_bdim, ndim, position, size),
            _batched(outputs, outputs_bdim, size, position), time_dim, reverse,
            _batched(initial, initial_bdim, size, position), cu_seqlens, log_coeffs, *config,
        )
        # d_coeffs has the batched coeffs' shape: a sample's is coeffs' own, without the size-1 dims added above.
        sample_shape = coeffs.shape if coeffs_bdim is None else coeffs.movedim(coeffs_bdim, 0).shape[1:]
        d_coeffs = d_coeffs.movedim(position, 0).reshape(size, *sample_shape)
        # Without an initial state, d_initial is an empty placeholder, the same for every vmapped call.
        return (d_inputs, d_coeffs, d_initial), (position, 0, position if initial is not None else None)

    torch.library.register_vmap(forward.name(), forward_vmap)
    torch.library.register_vmap(backward.name(), backward_vmap)


_register_vmap(torch.ops.linrec.forward.default, torch.ops.linrec.backward.default)
_register_vmap(torch.ops.linrec.triton_forward.default, torch.ops.linrec.triton_backward.default)
