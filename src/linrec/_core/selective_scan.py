"""The fused selective scan's ops (csrc/include/linrec/ssm/): fake kernels, derivatives, and the call that
``linrec.selective_scan`` makes.

torch.ops.linrec.selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens)
    -> (out, checkpoints, last_state)
torch.ops.linrec.selective_scan_backward(d_out, d_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                         initial, cu_seqlens, checkpoints, deterministic=False)
    -> (d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial)
torch.ops.linrec.selective_state_update(state, u, delta, A, B, C, D, z, delta_bias, delta_softplus, state_indices)
    -> out, the decode step, state updated in place (linrec.selective_state_update)
Schemas and semantics are declared in csrc/kernels/schemas.cpp. The forward is differentiable once (in
every tensor argument and through last_state); a second derivative raises.
"""

from __future__ import annotations

import torch
from torch.autograd.function import _SingleLevelFunction

from .autograd import direct, plain_autograd, records
from .backend import cuda_device_problem
from .library import HAS_CUDA_KERNELS  # importing library loads the ops

CHUNK = 512  # steps between checkpoints (ssm/params.h: kChunk)
_FORWARD = torch.ops.linrec.selective_scan_forward.default
_BACKWARD = torch.ops.linrec.selective_scan_backward.default


def _real_dtype(u: torch.Tensor) -> torch.dtype:
    return torch.float64 if u.dtype == torch.float64 else torch.float32


@torch.library.register_fake("linrec::selective_scan_forward")
def _forward_fake(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial=None,
                  cu_seqlens=None):
    # The C++ op's checks of these (ssm/ops.h), as the error convention's type (checks.py).
    torch._check_value(u.dim() == 3,
                       lambda: f"linrec.selective_scan_forward: u must be 3-dim (batch, d, length), got {u.dim()} dims")
    torch._check_value(A.dim() == 2, lambda: f"linrec.selective_scan_forward: A must be (d, n), got {A.dim()} dims")
    batch, d, length = u.shape
    n = A.shape[1]
    sequences = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    state = A.dtype  # the state's type: real, or complex beside a complex A (the op checks it)
    chunks = (length + CHUNK - 1) // CHUNK
    return (u.new_empty(u.shape), u.new_empty((batch, d, chunks, n), dtype=state),
            u.new_empty((sequences, d, n), dtype=state))


@torch.library.register_fake("linrec::selective_state_update")
def _state_update_fake(state, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       state_indices=None):
    return u.new_empty(u.shape)


@torch.library.register_fake("linrec::selective_scan_backward")
def _backward_fake(d_out, d_last_state, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens,
                   checkpoints, deterministic=False):
    def like(tensor: torch.Tensor | None) -> torch.Tensor:
        # Each gradient has its argument's dtype; an absent argument's is empty, of the real dtype.
        return u.new_empty((0,), dtype=_real_dtype(u)) if tensor is None else torch.empty_like(tensor)

    return (u.new_empty(u.shape), u.new_empty(u.shape), like(A), like(B), like(C), like(D), like(z), like(delta_bias),
            like(initial))


_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus", "initial", "cu_seqlens")


_TENSOR_INPUTS = tuple(name for name in _INPUTS if name != "delta_softplus")


def _setup_context(ctx, inputs, output):
    arguments = dict(zip(_INPUTS, inputs))
    ctx.delta_softplus = arguments["delta_softplus"]
    ctx.save_for_backward(*(arguments[name] for name in _TENSOR_INPUTS), output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, d_out, _d_checkpoints, d_last_state):
    return _gradients(ctx, d_out, d_last_state, _BACKWARD)


def _gradients(ctx, d_out, d_last_state, backward_op):
    """The gradients of the forward op's 11 arguments, from ``backward_op`` (the backward op, or a call of it
    below the Autograd key)."""
    saved = ctx.saved_tensors
    values = dict(zip(_TENSOR_INPUTS, saved[:-1]))
    checkpoints = saved[-1]
    u = values["u"]
    if d_out is None:
        d_out = torch.zeros_like(u)
    grads = backward_op(d_out.contiguous(), None if d_last_state is None else d_last_state.contiguous(), u,
                        values["delta"], values["A"], values["B"], values["C"], values["D"], values["z"],
                        values["delta_bias"], ctx.delta_softplus, values["initial"],
                        values["cu_seqlens"], checkpoints, _reproducible_sums_required())
    d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial = grads

    def given(name, gradient):  # absent optional arguments get None (the op returns an empty tensor)
        return gradient if values[name] is not None else None

    return (d_u, d_delta, d_A, d_B, d_C, given("D", d_D), given("z", d_z), given("delta_bias", d_delta_bias), None,
            given("initial", d_initial), None)


def _backward_below_autograd(*arguments):
    with torch._C._AutoDispatchBelowAutograd():
        return _BACKWARD(*arguments)


class _Fused(_SingleLevelFunction):
    """The forward op's Autograd kernel's work at the plain autograd level (``autograd.direct``), done here
    without the dispatcher's call into the registered kernel, which costs a short call about half its
    host time: the same saved tensors and gradients. The backward op is called below the Autograd key
    unless the backward records a graph (``create_graph``), where its own Autograd kernel refuses a
    second derivative."""

    @staticmethod
    def forward(ctx, *inputs):
        with torch._C._AutoDispatchBelowAutograd():
            output = _FORWARD(*inputs)
        _setup_context(ctx, inputs, output)
        # An unused output's gradient stays None: zeros of the checkpoints' and the last state's shapes
        # would cost a fill each, and the backward op takes no last-state gradient as zero.
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, d_out, _d_checkpoints, d_last_state):
        backward_op = _BACKWARD if torch.is_grad_enabled() else _backward_below_autograd
        return _gradients(ctx, d_out, d_last_state, backward_op)


torch.library.register_autograd("linrec::selective_scan_forward", _backward, setup_context=_setup_context)


def _no_second_derivative(ctx, *grads):
    raise NotImplementedError(
        "linrec.selective_scan: the fused kernels give first derivatives only; for higher derivatives pass "
        "backend='composed', which runs the scan as one linrec.linrec call over the expanded state")


def _backward_setup(ctx, inputs, output):
    pass


torch.library.register_autograd("linrec::selective_scan_backward", _no_second_derivative,
                                setup_context=_backward_setup)


def _reproducible_sums_required() -> bool:
    """torch.use_deterministic_algorithms(True) without warn_only; torch.compile reads it once, at tracing."""
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


# What torch.compiler.assume_constant_result sets (Dynamo cannot trace the warn_only flag into a graph), set
# here: that function imports torch._dynamo, which would add 1-2 s to ``import linrec``. A test holds the mark
# to the one torch.compiler.assume_constant_result gives.
_reproducible_sums_required._dynamo_marked_constant = True


def runs_fused(backend: str, device: torch.device, sums_in_fixed_order: bool) -> bool:
    """Whether linrec.selective_scan takes the fused kernels: backend "auto", a CPU tensor or a GPU the
    build's CUDA kernels run on, and, where ``torch.use_deterministic_algorithms(True)`` asks for reproducible
    results on the GPU, a call whose fused backward can sum its gradients in a fixed order
    (``sums_in_fixed_order``: B and C fixed, or varying where the lane kernels take them; the other kernels
    add a varying B's and C's gradient terms with atomic adds, in an order that varies from run to run, and
    the composed scan runs instead). With ``warn_only=True`` the fused kernels stay, as torch keeps its own
    nondeterministic kernels then. Under a torch.func transform or forward-mode AD the composed scan runs:
    the fused ops have first reverse-mode derivatives only, the composed scan every transform of
    ``linrec.linrec``."""
    if backend != "auto" or not plain_autograd():
        return False
    if device.type == "cpu":
        return True
    if device.type != "cuda" or not HAS_CUDA_KERNELS:
        return False
    if not sums_in_fixed_order and _reproducible_sums_required():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.compiler.is_compiling() or cuda_device_problem(index) is None


def fused(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens):
    """The forward op with autograd: (out, last_state)."""
    arguments = (u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens)
    tensors = (u, delta, A, B, C, D, z, delta_bias, initial, cu_seqlens)
    if not direct(tensors):
        out, _checkpoints, last_state = _FORWARD(*arguments)
    elif records(tensors):
        out, _checkpoints, last_state = _Fused.apply(*arguments)
    else:
        with torch._C._AutoDispatchBelowAutograd():
            out, _checkpoints, last_state = _FORWARD(*arguments)
    return out, last_state
