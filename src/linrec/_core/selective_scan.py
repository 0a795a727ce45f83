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


# ----- the operands the ops take -------------------------------------------------------------------------
# A complex dtype's real part (what dtype.to_real gives, which torch.compile does not trace), and back.
REAL_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}
COMPLEX_OF = {real: complex_dtype for complex_dtype, real in REAL_PART.items()}
# The dtypes whose calls compute in float32 (no float64 or complex argument), for compute_dtypes' shortcut.
_FLOAT32_COMPUTED = frozenset((torch.float32, torch.float16, torch.bfloat16))


def compute_dtypes(u, delta, A, B, C, D, z, delta_bias, initial) -> tuple[torch.dtype, torch.dtype]:
    """(real, state): float32 at least, float64 where any argument is; the state's, the real dtype or its
    complex type beside a complex A."""
    arguments = (u, delta, A, B, C, D, z, delta_bias, initial)
    if all(tensor is None or tensor.dtype in _FLOAT32_COMPUTED for tensor in arguments):
        return torch.float32, torch.float32
    real_dtype = torch.float32
    for tensor in arguments:
        if tensor is not None:
            real_dtype = torch.promote_types(real_dtype, REAL_PART.get(tensor.dtype, tensor.dtype))
    return real_dtype, COMPLEX_OF[real_dtype] if A.is_complex() else real_dtype


def contiguous_as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """tensor in dtype, contiguous: itself where it is (no dispatch of a no-op .to and .contiguous, which is most
    of a short call's host time in these conversions)."""
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def as_operand(M: torch.Tensor, dtype: torch.dtype, length: int) -> torch.Tensor:
    """B or C in the compute dtype: fixed ones stay (d, n); time-varying ones become (batch, groups, n,
    length), a shared one with groups = 1, interleaved (real, imag) pairs read as complex numbers."""
    if M.dim() == 2:
        return contiguous_as(M, dtype)
    if M.dim() == 3:
        M = M.unsqueeze(1)
    if dtype.is_complex and not M.is_complex():
        real = contiguous_as(M, REAL_PART[dtype])  # M itself where it is contiguous: no copy
        # A complex view starts on a whole complex element; a traced call cannot read the offset.
        if torch.compiler.is_compiling() or real.storage_offset() % 2:
            real = real.clone()
        return torch.view_as_complex(real.view(*real.shape[:-1], real.shape[-1] // 2, 2))
    return contiguous_as(M, dtype)


def fused_operands(u, delta, A, B, C, D, z, delta_bias, initial, real_dtype: torch.dtype,
                   state_dtype: torch.dtype) -> tuple[torch.Tensor | None, ...]:
    """The fused ops' operands (u, delta, A, B, C, D, z, delta_bias, initial): the per-step operands in one dtype
    (u's, delta's and z's common one, or float64 where any argument is), D and delta_bias in the real dtype
    (float32, or float64), A and initial in the state dtype (that, or its complex type beside a complex A), B
    and C varying as (batch, groups, n, length): in the state dtype for a complex A (interleaved pairs read as
    complex numbers), else in the per-step or the real dtype. Shared by the scan and its decode step
    (linrec.selective_state_update), so that both compute from the same values."""
    if real_dtype == torch.float64:
        values = torch.float64
    else:
        values = u.dtype
        for tensor in (delta, z):
            if tensor is not None and tensor.dtype != values:
                values = torch.promote_types(values, tensor.dtype)

    def per_step(tensor):
        return None if tensor is None else contiguous_as(tensor, values)

    def small(tensor, dtype=real_dtype):
        return None if tensor is None else contiguous_as(tensor, dtype)

    def projection(M, dtype):
        if state_dtype.is_complex:
            return as_operand(M, state_dtype, u.shape[-1])
        return small(M, state_dtype) if M.dim() == 2 else contiguous_as(M if M.dim() == 4 else M.unsqueeze(1), dtype)

    wide = any(M.dim() > 2 and M.dtype != values for M in (B, C))
    projection_dtype = real_dtype if wide else values
    return (per_step(u), per_step(delta), small(A, state_dtype), projection(B, projection_dtype),
            projection(C, projection_dtype), small(D), per_step(z), small(delta_bias), small(initial, state_dtype))


def op_inputs(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype: torch.dtype,
              state_dtype: torch.dtype) -> tuple:
    """The forward op's 11 inputs from the caller's arguments (fused_operands)."""
    operands = fused_operands(u, delta, A, B, C, D, z, delta_bias, initial, real_dtype, state_dtype)
    return (*operands[:8], delta_softplus, operands[8], cu_seqlens)


def in_dtype_of(out: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The op's output in u's dtype (itself where it is: no dispatch of a no-op .to)."""
    return out if out.dtype == u.dtype else out.to(u.dtype)


def layout_of(argument: torch.Tensor | None) -> tuple[int, bool] | None:
    """What as_argument reads of an argument: its dims and whether it is complex."""
    return None if argument is None else (argument.dim(), argument.is_complex())


def as_argument(gradient: torch.Tensor | None, layout: tuple[int, bool] | None) -> torch.Tensor | None:
    """The gradient of an operand (fused_operands') in its argument's layout (layout_of): a real
    argument's part of a complex state's gradient (interleaved (real, imag) pairs for a varying B or C, the
    real part for any other), a shared B's or C's (batch, n, length). Its dtype is left to autograd, which
    casts a gradient to its input's."""
    if gradient is None or layout is None:
        return gradient
    dims, is_complex = layout
    varying = dims > 2 and gradient.dim() == 4  # a B or C along time
    if gradient.is_complex() and not is_complex:
        gradient = torch.view_as_real(gradient).flatten(-2) if varying else gradient.real
    return gradient.squeeze(1) if varying and dims == 3 else gradient


# ----- the forward op's autograd ----------------------------------------------------------------------------
_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus", "initial", "cu_seqlens")


_TENSOR_INPUTS = tuple(name for name in _INPUTS if name != "delta_softplus")


def _save(ctx, inputs, checkpoints) -> None:
    """What the backward op reads of a forward call with these 11 inputs: its tensors, the checkpoints and
    delta_softplus (_gradients)."""
    arguments = dict(zip(_INPUTS, inputs))
    ctx.delta_softplus = arguments["delta_softplus"]
    ctx.save_for_backward(*(arguments[name] for name in _TENSOR_INPUTS), checkpoints)


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, output[1])
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
    """linrec.selective_scan's fused call at the plain autograd level (``autograd.direct``), from the caller's
    tensors: their conversions to the ops' operands (fused_operands), the forward op (called below the
    Autograd key, without the dispatcher's call into its registered Autograd kernel) and the output's
    conversion back to u's dtype, recorded as one node, whose backward gives the gradients in the
    arguments' layouts (as_argument). The ops' saved tensors and gradients are those of the op's
    registered Autograd kernel (_setup_context, _gradients). The backward op is called below the Autograd
    key unless the backward records a graph (``create_graph``), where its own Autograd kernel refuses a
    second derivative."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype,
                state_dtype):
        inputs = op_inputs(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype,
                           state_dtype)
        with torch._C._AutoDispatchBelowAutograd():
            out, checkpoints, last_state = _FORWARD(*inputs)
        _save(ctx, inputs, checkpoints)
        ctx.out_dtype = out.dtype  # the backward op's d_out's
        # The layouts of the arguments whose gradients may differ from their operands' (as_argument).
        ctx.layouts = (None, None, layout_of(A), layout_of(B), layout_of(C), None, None, None, None,
                       layout_of(initial), None)
        # An unused output's gradient stays None: zeros of the last state's shape would cost a fill, and the
        # backward op takes no last-state gradient as zero.
        ctx.set_materialize_grads(False)
        return in_dtype_of(out, u), last_state

    @staticmethod
    def backward(ctx, d_out, d_last_state):
        backward_op = _BACKWARD if torch.is_grad_enabled() else _backward_below_autograd
        if d_out is not None:
            d_out = contiguous_as(d_out, ctx.out_dtype)
        grads = _gradients(ctx, d_out, d_last_state, backward_op)
        return (*map(as_argument, grads, ctx.layouts), None, None)


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


def fused(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype: torch.dtype,
          state_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward op with autograd, on the caller's tensors: (out in u's dtype, last_state)."""
    tensors = (u, delta, A, B, C, D, z, delta_bias, initial, cu_seqlens)
    at_plain_level = direct(tensors)
    if at_plain_level and records(tensors):
        return _Fused.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype,
                            state_dtype)
    arguments = op_inputs(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens, real_dtype,
                          state_dtype)
    if at_plain_level:  # nothing to record: the kernel below the Autograd key
        with torch._C._AutoDispatchBelowAutograd():
            out, _checkpoints, last_state = _FORWARD(*arguments)
    else:
        out, _checkpoints, last_state = _FORWARD(*arguments)
    return in_dtype_of(out, u), last_state
