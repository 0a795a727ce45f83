"""causal-conv1d's functions (``causal_conv1d.causal_conv1d_fn`` and ``causal_conv1d_update``), with its
signatures, on :func:`linrec.causal_conv1d` and :func:`linrec.causal_conv1d_update`."""

from __future__ import annotations

import torch

from ..conv import causal_conv1d, causal_conv1d_update as _update

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """causal-conv1d's ``causal_conv1d_fn``: x (batch, dim, length), weight (dim, width), bias (dim,);
    ``seq_idx`` (batch, length), the sequence of each step: a step reads no step of another sequence (each
    sequence starts from zeros); ``initial_states`` (batch, dim, width - 1); ``return_final_states`` also returns
    the last width - 1 inputs (written into ``final_states_out`` where given); ``activation`` None, "silu" or
    "swish". Unlike causal-conv1d's kernels, x may have any strides."""
    if seq_idx is not None:
        if initial_states is not None or return_final_states:
            raise ValueError("causal_conv1d_fn: seq_idx takes no initial_states and returns no final states")
        return _with_sequence_ids(x, weight, bias, seq_idx, activation)
    result = causal_conv1d(x, weight, bias, activation, initial_states, return_final_states=return_final_states)
    if return_final_states and final_states_out is not None:
        final_states_out.copy_(result[1])
        return result[0], final_states_out
    return result


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """causal-conv1d's ``causal_conv1d_update``: x (batch, dim) or (batch, dim, steps), ``conv_state`` (batch, dim,
    state_len) updated in place, ``conv_state_indices`` (batch,) the state row of each batch row. The circular
    buffer of ``cache_seqlens`` is not supported (a ValueError)."""
    if cache_seqlens is not None:
        raise ValueError("causal_conv1d_update: cache_seqlens (a circular conv_state) is not supported by linrec; "
                         "pass conv_state in order, oldest first")
    return _update(x, conv_state, weight, bias, activation, conv_state_indices)


def _with_sequence_ids(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor,
                       activation: str | None) -> torch.Tensor:
    """The convolution of rows whose steps belong to the sequences ``seq_idx`` numbers: a step's taps on steps of
    another sequence read zeros, as causal-conv1d's kernels do."""
    batch, dim, length = x.shape
    if list(seq_idx.shape) != [batch, length]:
        raise ValueError(f"causal_conv1d_fn: seq_idx must have shape (batch, length) = {[batch, length]}, got "
                         f"{list(seq_idx.shape)}")
    # Every row packed into one: a new sequence starts wherever the id changes, and at each row's start.
    starts = torch.ones(batch, length, dtype=torch.bool, device=x.device)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    first_steps = torch.nonzero(starts.flatten()).flatten()
    total = batch * length
    offsets = torch.cat([first_steps, first_steps.new_tensor([total])])
    packed = x.permute(1, 0, 2).reshape(1, dim, total)
    out = causal_conv1d(packed, weight, bias, activation, cu_seqlens=offsets)
    return out.reshape(dim, batch, length).permute(1, 0, 2)
