"""The causal convolution's CUDA ops (csrc/include/linrec/conv/): fake kernels, derivatives, and the calls that
``linrec.causal_conv1d`` and ``linrec.causal_conv1d_update`` make on the GPU.

torch.ops.linrec.causal_conv1d_forward(x, weight, bias, silu, initial_states, cu_seqlens, return_final_states)
    -> (out, final_states)
torch.ops.linrec.causal_conv1d_backward(d_out, d_final_states, x, weight, bias, silu, initial_states, cu_seqlens)
    -> (d_x, d_weight, d_bias, d_initial_states)
torch.ops.linrec.causal_conv1d_update(conv_state, x, weight, bias, silu, conv_state_indices) -> out
Schemas and semantics are declared in csrc/kernels/schemas.cpp. The kernels take widths 1 to MAX_WIDTH. The
forward op is differentiable once through its backward op; a graph of the backward (``create_graph``) takes
the composed convolution's derivatives, which torch differentiates again.
"""

from __future__ import annotations

import torch

from .autograd import plain_autograd
from .backend import cuda_device_problem
from .library import HAS_CUDA_KERNELS  # importing library loads the ops
from .selective_scan import contiguous_as

#: The widest kernel the CUDA kernels take (csrc/include/linrec/conv/params.h: kMaxWidth).
MAX_WIDTH = 4
_FORWARD = torch.ops.linrec.causal_conv1d_forward.default
_BACKWARD = torch.ops.linrec.causal_conv1d_backward.default
_UPDATE = torch.ops.linrec.causal_conv1d_update.default


@torch.library.register_fake("linrec::causal_conv1d_forward")
def _forward_fake(x, weight, bias=None, silu=False, initial_states=None, cu_seqlens=None, return_final_states=False):
    sequences = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final_shape = (sequences, x.shape[1], weight.shape[1] - 1) if return_final_states else (0,)
    return new_output(x), x.new_empty(final_shape)


@torch.library.register_fake("linrec::causal_conv1d_backward")
def _backward_fake(d_out, d_final_states, x, weight, bias, silu, initial_states, cu_seqlens):
    def like(tensor: torch.Tensor | None) -> torch.Tensor:
        return weight.new_empty((0,)) if tensor is None else torch.empty_like(tensor)

    return new_output(x), torch.empty_like(weight), like(bias), like(initial_states)


@torch.library.register_fake("linrec::causal_conv1d_update")
def _update_fake(conv_state, x, weight, bias=None, silu=False, conv_state_indices=None):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, weight, bias, silu, initial_states, cu_seqlens, _return_final_states = inputs
    ctx.silu = silu
    ctx.save_for_backward(x, weight, bias, initial_states, cu_seqlens)


def _backward(ctx, d_out, d_final_states):
    x, weight, bias, initial_states, cu_seqlens = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: derivatives torch can differentiate again
        return (*_composed_gradients(ctx, d_out, d_final_states), None, None)
    if d_final_states is not None and d_final_states.numel() == 0:
        d_final_states = None  # not asked for: the op returned an empty tensor
    d_x, d_weight, d_bias, d_initial = _BACKWARD(
        in_output_layout(d_out, x), None if d_final_states is None else d_final_states.contiguous(), x, weight,
        bias, ctx.silu, initial_states, cu_seqlens)
    return (d_x, d_weight, d_bias if bias is not None else None, None,
            d_initial if initial_states is not None else None, None, None)


def _composed_gradients(ctx, d_out, d_final_states) -> tuple:
    """(d_x, d_weight, d_bias, None, d_initial_states) from the composed convolution, as a graph."""
    from ..conv import composed_causal_conv1d  # the public module imports this one

    x, weight, bias, initial_states, cu_seqlens = ctx.saved_tensors
    with torch.enable_grad():
        out, final = composed_causal_conv1d(x, weight, bias, "silu" if ctx.silu else None, initial_states, cu_seqlens)
        inputs = [t for t in (x, weight, bias, initial_states) if t is not None and t.requires_grad]
        outputs, grads = [out], [d_out]
        if d_final_states is not None and d_final_states.numel():
            outputs.append(final)
            grads.append(d_final_states)
        found = iter(torch.autograd.grad(outputs, inputs, grads, create_graph=True, allow_unused=True))
    return tuple(next(found) if t is not None and t.requires_grad else None for t in (x, weight, bias)) + (
        None, next(found) if initial_states is not None and initial_states.requires_grad else None)


torch.library.register_autograd("linrec::causal_conv1d_forward", _backward, setup_context=_setup_context)


def runs_on_kernels(x: torch.Tensor, width: int) -> bool:
    """Whether a call on ``x`` takes the CUDA kernels: a GPU the build's kernels run on, a width they are
    compiled for, and the plain autograd level (under a torch.func transform or forward-mode AD the composed
    convolution runs: the ops have first reverse-mode derivatives only)."""
    if not (x.is_cuda and HAS_CUDA_KERNELS and 1 <= width <= MAX_WIDTH):
        return False
    if torch.compiler.is_compiling():  # traced: the op (its fake kernel), whose device torch checks at run time
        return True
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return plain_autograd() and cuda_device_problem(index) is None


def is_channel_last(x: torch.Tensor) -> bool:
    """x (batch, dim, length) with its channels contiguous and not its steps: a (batch, length, channels) tensor
    transposed, or a slice of one, which the kernels read as it is (csrc/include/linrec/conv/ops.h)."""
    return x.stride(2) != 1 and x.stride(1) == 1


def as_kernel_input(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: itself where its steps are contiguous (a slice of a (batch, channels, length)
    projection too) or its channels are, else a contiguous copy."""
    return x if x.stride(2) == 1 or is_channel_last(x) else x.contiguous()


def new_output(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor of x's shape in the layout of the ops' outputs: contiguous, or for channel-last x
    (batch, length, dim) dense, transposed."""
    if is_channel_last(x):
        return x.new_empty((x.shape[0], x.shape[2], x.shape[1])).transpose(1, 2)
    return x.new_empty(x.shape)


def in_output_layout(tensor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """tensor (of x's shape) in the layout of the op's outputs for x: contiguous, or for channel-last x
    (batch, length, dim) dense, transposed."""
    if not is_channel_last(x):
        return tensor.contiguous()
    return tensor.transpose(1, 2).contiguous().transpose(1, 2)


def _operand(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else contiguous_as(tensor, dtype)


def forward(x, weight, bias, silu: bool, initial_states, cu_seqlens, return_final_states: bool,
            real_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op (with autograd) on the caller's tensors: (out, final_states or an empty tensor). x is read
    where it lies when its steps or its channels are contiguous (as_kernel_input), out then contiguous or, for
    channel-last x, channel-last; the parameters converted to ``real_dtype`` (float32, or float64 beside float64
    x)."""
    return _FORWARD(as_kernel_input(x), _operand(weight, real_dtype),
                    _operand(bias, real_dtype), silu, _operand(initial_states, real_dtype), cu_seqlens,
                    return_final_states)


def update(conv_state, x, weight, bias, silu: bool, conv_state_indices, real_dtype: torch.dtype) -> torch.Tensor:
    """The decode step's op: x (batch, dim, steps) made contiguous, conv_state updated in place."""
    return _UPDATE(conv_state, contiguous_as(x, x.dtype), _operand(weight, real_dtype),
                   _operand(bias, real_dtype), silu, conv_state_indices)

