"""Derivatives of the two ops, registered as their Autograd kernels: reverse mode (``backward``) and
forward mode (``jvp``) of ``linrec::forward`` and of ``linrec::backward``, so that every order of
derivative, ``torch.func`` transform and ``torch.compile`` reaches the same formulas. The Triton
family (``linrec::triton_forward``, ``linrec::triton_backward``) gets the same kernels, each formula
calling the ops of the family it differentiates.

Notation: the forward op computes ``y[l] = c[l] * y[l-1] + x[l]`` from ``y[-1] = h`` (the initial state;
without one, ``y[0] = x[0]``), ``prev(v)`` is ``v`` one step back along the scan within each sequence
(``h`` or 0 at a sequence's first step, ``steps.previous_step``), ``next`` and ``first`` are its adjoints.
The backward op computes, for the upstream gradient ``g``,

    dx = L^H g        (a scan against the forward's direction with coefficients conj(c) shifted by one)
    dc = dx * conj(prev(y))             (times c with log_coeffs: the gradient in log c)
    dh = conj(c[first]) * dx[first]

Each derivative below is again one of the two ops plus products and shifts of the same operands:

- forward op, tangents (x', c', h'): ``y' = forward(x' + c' * prev(y), c, initial=h')``, with c' in
  units of c (``c * a'`` for a tangent a' of log coefficients).
- backward op, cotangents (u, v, w) of (dx, dc, dh): ``z = forward(u + v * prev(y) [* c], c, initial=w)``
  is the gradient of g; ``backward(g, c, z, initial=w)``'s dc is that of c (plus ``v * dc`` in log
  space); ``p = conj(v) * dx [* c]`` gives y's as ``next(p)`` and h's as ``first(p)``.
- backward op, tangents (g', c', y', h'): with ``r = conj(c') * dx``,
  ``backward(g' + next(r), c, y, h)`` gives dx' and dc' and dh' as far as they
  come from dx'; dc' adds ``dx * conj(prev(y'))`` (with h' at each first step) and ``a' * dc`` in log
  space, dh' adds ``first(r)``.

With mixed precision (float32 coeffs or initial, 16-bit inputs) the products of a float32 term and a
16-bit one promote to float32; each result goes back to the dtype of the operand or derivative it
stands for (``_in_dtype``): outputs' and inputs' derivatives in inputs' dtype, coeffs' in coeffs', and
initial's in initial's.

For complex dtypes these are PyTorch's conventions (gradients are conjugate Wirtinger derivatives,
tangents directional derivatives), which gradcheck and gradgradcheck verify.
"""

from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import torch
from torch._C._functorch import TransformType, get_interpreter_stack, peek_interpreter_stack
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd import forward_ad
from torch.autograd.forward_ad import _set_fwd_grad_enabled
from torch.autograd.function import _SingleLevelFunction
from torch.overrides import has_torch_function

from .steps import first_step, next_step, previous_step

_LIBRARY = torch.library.Library("linrec", "IMPL")


class Kernels(NamedTuple):
    """One family of the two ops: the derivatives of each op are formed from the ops of its own family.
    The overloads themselves: calling them skips the packet's overload resolution on every call."""

    forward: torch._ops.OpOverload
    backward: torch._ops.OpOverload


#: linrec::forward and linrec::backward, the compiled CPU and CUDA kernels.
COMPILED = Kernels(torch.ops.linrec.forward.default, torch.ops.linrec.backward.default)
#: linrec::triton_forward and linrec::triton_backward.
TRITON = Kernels(torch.ops.linrec.triton_forward.default, torch.ops.linrec.triton_backward.default)
# The dispatch keys after Autograd, to which torch.library.register_autograd's kernels also redispatch.
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


def plain_autograd() -> bool:
    """True when no torch.func transform is active and no forward-mode AD level is open: an op call then
    has at most the ordinary reverse-mode node to record, and no operand can carry a tangent (forward_ad's
    own unpack_dual reads the same level to tell that a tensor has none)."""
    return peek_interpreter_stack() is None and forward_ad._current_level < 0


def direct(tensors: tuple[torch.Tensor | None, ...]) -> bool:
    """Whether a call from this package may do the Autograd kernel's work itself (``apply_forward``)
    instead of calling the op: in eager mode (torch.compile and export trace the op),
    at the plain autograd level, and with no ``__torch_function__`` (operand subclass or mode) that
    would be handed the op."""
    return not torch.compiler.is_compiling() and plain_autograd() and not has_torch_function(tensors)


def records(differentiable: tuple[torch.Tensor | None, ...]) -> bool:
    """Whether an op call at the plain autograd level records a node: gradients enabled and an operand
    requiring one."""
    if torch.is_grad_enabled():
        for tensor in differentiable:
            if tensor is not None and tensor.requires_grad:
                return True
    return False


def below_this_level() -> contextlib.AbstractContextManager:
    """The context of a Function's forward: the kernels below the Autograd key, with gradient tracking on.
    The Function records the op at this level; under nested torch.func transforms each lower level's
    Autograd key is reached on the way down, and its Function must find gradients enabled there (the
    Function machinery turns them off for forward), as torch's own transforms of autograd.Functions do.
    Without a transform there is no lower level, and only the dispatch below the Autograd key is needed."""
    if peek_interpreter_stack() is None:
        return torch._C._AutoDispatchBelowAutograd()
    guards = contextlib.ExitStack()
    guards.enter_context(torch.enable_grad())
    guards.enter_context(_set_fwd_grad_enabled(True))
    guards.enter_context(torch._C._AutoDispatchBelowAutograd())
    return guards


def check_single_forward_mode_level() -> None:
    """The jvp formulas run with forward gradients off, so a forward-mode transform around another one
    would not see their ops: refuse it rather than return a wrong derivative."""
    stack = get_interpreter_stack() or []
    if sum(interpreter.key() == TransformType.Jvp for interpreter in stack) > 1:
        raise NotImplementedError(
            "linrec: forward-mode AD nested in forward-mode AD (torch.func.jacfwd or jvp of a jacfwd or jvp) "
            "is not supported; second derivatives work as torch.func.hessian (jacfwd of jacrev), jacrev of "
            "jacrev or jacrev of jacfwd"
        )


def save_for_forward(ctx, *tensors: torch.Tensor | None) -> None:
    """Saves a Function's tensors for its jvp, which runs under forward-mode AD only: at the plain autograd
    level no tangent can reach it, and the call skips the save."""
    if not plain_autograd():
        ctx.save_for_forward(*tensors)


def _add(total: torch.Tensor | None, term: torch.Tensor | None) -> torch.Tensor | None:
    """Sums optional terms (None is zero)."""
    if term is None:
        return total
    return term if total is None else total + term


def _times_c_in_log_space(values: torch.Tensor, coeffs: torch.Tensor, log_coeffs: bool) -> torch.Tensor:
    """``values * c`` where coeffs hold ``log c`` (d c = c d log c), else ``values``."""
    return values * coeffs.exp() if log_coeffs else values


def _in_dtype(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` in ``like``'s dtype. With mixed precision (float32 coeffs or initial, 16-bit inputs) the
    formulas' products of the two promote to float32; each term goes back to the dtype of the operand or
    derivative it stands for (forward-mode AD refuses a tangent of another dtype than its primal's)."""
    return values if values.dtype == like.dtype else values.to(like.dtype)


def _full(values: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An operand of the ops in ``like``'s shape and dtype: zeros for None, broadcast terms expanded
    (stride 0, no copy)."""
    if values is None:
        return torch.zeros_like(like)
    values = _in_dtype(values, like)
    return values if values.shape == like.shape else values.expand(like.shape)


def _reduce_to(gradient: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sums a per-element coefficient gradient over the dims ``like`` (broadcast coeffs) broadcasts along."""
    return gradient if gradient.shape == like.shape else gradient.sum_to_size(like.shape)


def forward_tangent_operand(t_inputs: torch.Tensor | None, t_coeffs: torch.Tensor | None, coeffs: torch.Tensor,
                            log_coeffs: bool, previous: Callable[[], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The inputs of the forward op whose outputs are the forward op's tangent: ``x' + c' * prev(y)`` (c' in
    units of c), in ``like``'s shape and dtype. ``previous()`` gives ``prev(y)``, called only for a tangent
    of the coefficients."""
    driving = t_inputs
    if t_coeffs is not None:
        driving = _add(driving, _times_c_in_log_space(t_coeffs, coeffs, log_coeffs) * previous())
    return _full(driving, like)


class _Forward(_SingleLevelFunction):
    """A forward op as (inputs, coeffs, initial, cu_seqlens, options) -> outputs, with the op's family and its
    other arguments in one tuple, options = (kernels, dim, reverse, log_coeffs, config, config): each argument
    of a Function costs its apply and its backward node time, about 0.2 us."""

    @staticmethod
    def forward(ctx, inputs, coeffs, initial, cu_seqlens, options):
        kernels, dim, reverse, log_coeffs, *config = options
        with below_this_level():
            outputs = kernels.forward(inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs, *config)
        ctx.save_for_backward(coeffs, outputs, initial, cu_seqlens)
        save_for_forward(ctx, coeffs, outputs, initial, cu_seqlens)
        # One attribute: each costs the call about 0.15 us. The forced kernel config, if any, is the forward's alone.
        ctx.options = kernels, dim % outputs.dim(), reverse, log_coeffs
        return outputs

    @staticmethod
    def backward(ctx, d_outputs):
        coeffs, outputs, initial, cu_seqlens = ctx.saved_tensors
        kernels, dim, reverse, log_coeffs = ctx.options
        d_inputs, d_coeffs, d_initial = _call_backward(
            kernels, d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs
        )
        d_initial = d_initial if initial is not None else None
        return d_inputs, d_coeffs, d_initial, None, None

    @staticmethod
    def jvp(ctx, t_inputs, t_coeffs, t_initial, _t_cu_seqlens, _options):
        check_single_forward_mode_level()
        coeffs, outputs, initial, cu_seqlens = ctx.saved_tensors
        kernels, dim, reverse, log_coeffs = ctx.options
        driving = forward_tangent_operand(t_inputs, t_coeffs, coeffs, log_coeffs,
                                          lambda: previous_step(outputs, initial, dim, reverse, cu_seqlens), outputs)
        return _call_forward(kernels, driving, coeffs, dim, reverse, t_initial, cu_seqlens, log_coeffs)


class _Backward(_SingleLevelFunction):
    """A backward op as (d_outputs, coeffs, outputs, initial, cu_seqlens, options) -> (d_inputs, d_coeffs
    in coeffs' shape, d_initial), options as ``_Forward``'s."""

    @staticmethod
    def forward(ctx, d_outputs, coeffs, outputs, initial, cu_seqlens, options):
        kernels, dim, reverse, log_coeffs, *config = options
        with below_this_level():
            d_inputs, d_coeffs, d_initial = kernels.backward(
                d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs, *config
            )
        ctx.save_for_backward(d_outputs, coeffs, outputs, initial, cu_seqlens, d_inputs, d_coeffs)
        save_for_forward(ctx, d_outputs, coeffs, outputs, initial, cu_seqlens, d_inputs, d_coeffs)
        ctx.options = kernels, dim % outputs.dim(), reverse, log_coeffs
        ctx.set_materialize_grads(False)
        if initial is None:
            ctx.mark_non_differentiable(d_initial)  # the empty placeholder
        return d_inputs, d_coeffs, d_initial

    @staticmethod
    def backward(ctx, v_inputs, v_coeffs, v_initial):
        d_outputs, coeffs, outputs, initial, cu_seqlens, d_inputs, d_coeffs = ctx.saved_tensors
        kernels, dim, reverse, log_coeffs = ctx.options
        # The cotangent reaching dx: its own, and dc's and dh's through their factors of dx.
        v_total = v_inputs
        grad_outputs = grad_initial = None
        if v_coeffs is not None:
            factor = _times_c_in_log_space(previous_step(outputs, initial, dim, reverse, cu_seqlens), coeffs, log_coeffs)
            v_total = _add(v_total, v_coeffs * factor)
            # dc depends on y through conj(prev(y)), and on h at each sequence's first step.
            product = _times_c_in_log_space(v_coeffs.conj() * d_inputs, coeffs, log_coeffs)
            grad_outputs = _in_dtype(next_step(product, dim, reverse, cu_seqlens), outputs)
            if initial is not None:
                grad_initial = _in_dtype(first_step(product, dim, reverse, cu_seqlens), initial)
        grad_d_outputs = grad_coeffs = None
        if v_total is not None or v_initial is not None:
            grad_d_outputs = _call_forward(
                kernels, _full(v_total, outputs), coeffs, dim, reverse, v_initial, cu_seqlens, log_coeffs
            )
            # dx * conj(prev(z)) with w at each first step: the backward op computes it, dx again included.
            grad_coeffs = _call_backward(
                kernels, d_outputs, coeffs, grad_d_outputs, dim, reverse, v_initial, cu_seqlens, log_coeffs
            )[1]
        if log_coeffs and v_coeffs is not None:
            grad_coeffs = _add(grad_coeffs, v_coeffs * d_coeffs)  # dc's own factor c = exp(log c)
        return grad_d_outputs, grad_coeffs, grad_outputs, grad_initial, None, None

    @staticmethod
    def jvp(ctx, t_d_outputs, t_coeffs, t_outputs, t_initial, _t_cu_seqlens, _options):
        check_single_forward_mode_level()
        d_outputs, coeffs, outputs, initial, cu_seqlens, d_inputs, d_coeffs = ctx.saved_tensors
        kernels, dim, reverse, log_coeffs = ctx.options
        # dx[l] = g[l] + conj(c[next]) * dx[next]: a tangent of c drives the scan like a tangent of g.
        driving = t_d_outputs
        coeff_term = None
        if t_coeffs is not None:
            coeff_term = _times_c_in_log_space(t_coeffs, coeffs, log_coeffs).conj() * d_inputs
            driving = _add(driving, next_step(coeff_term, dim, reverse, cu_seqlens))
        t_d_inputs, t_d_coeffs, t_d_initial = _call_backward(
            kernels, _full(driving, outputs), coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs
        )
        if t_outputs is not None or t_initial is not None:
            t_previous = previous_step(_full(t_outputs, outputs), t_initial, dim, reverse, cu_seqlens)
            t_d_coeffs_outputs = _times_c_in_log_space(d_inputs * t_previous.conj(), coeffs, log_coeffs)
            t_d_coeffs = _in_dtype(t_d_coeffs + _reduce_to(t_d_coeffs_outputs, coeffs), coeffs)
        if log_coeffs and t_coeffs is not None:
            t_d_coeffs = t_d_coeffs + t_coeffs * d_coeffs
        if initial is None:
            return t_d_inputs, t_d_coeffs, None  # d_initial is a non-differentiable placeholder
        if coeff_term is not None:
            t_d_initial = _in_dtype(t_d_initial + first_step(coeff_term, dim, reverse, cu_seqlens), initial)
        return t_d_inputs, t_d_coeffs, t_d_initial


def apply_forward(kernels: Kernels, inputs: torch.Tensor, coeffs: torch.Tensor, dim: int, reverse: bool,
                  initial: torch.Tensor | None, cu_seqlens: torch.Tensor | None, log_coeffs: bool) -> torch.Tensor:
    """What the forward op's Autograd kernel does with a call at the plain autograd level (where ``direct``
    holds), without the dispatcher's call into Python to reach it (about 3 us): applies the Function
    where the call records a node, else runs the kernels below the Autograd key."""
    if records((inputs, coeffs, initial)):
        return _Forward.apply(inputs, coeffs, initial, cu_seqlens, (kernels, dim, reverse, log_coeffs, 0, 0))
    with torch._C._AutoDispatchBelowAutograd():
        return kernels.forward(inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)


def _call_forward(kernels, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs):
    """The forward op, as the derivative formulas call it."""
    if direct((inputs, coeffs, initial, cu_seqlens)):
        return apply_forward(kernels, inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)
    return kernels.forward(inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs)


def _sums_atomically(kernels: Kernels, coeffs: torch.Tensor, outputs: torch.Tensor) -> bool:
    """Whether the backward op would add broadcast coefficients' gradient atomically (the CUDA kernels sum
    it in the kernel, in an order that varies from run to run) while ``torch.use_deterministic_algorithms(True)``
    asks for reproducible results. With ``warn_only=True`` the atomic sum stays, as torch keeps its own
    nondeterministic kernels then."""
    return (kernels is COMPILED and outputs.is_cuda and coeffs.numel() < outputs.numel()
            and torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled())


def _call_backward(kernels, d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs):
    """The backward op, as the derivative formulas call it (doing its Autograd kernel's work as
    ``apply_forward`` does the forward op's). Under deterministic algorithms, broadcast coefficients
    are passed expanded (a stride-0 view): the kernels write the gradient per element and torch sums it
    in a fixed order."""
    if _sums_atomically(kernels, coeffs, outputs):
        d_inputs, d_coeffs, d_initial = _call_backward(kernels, d_outputs, coeffs.expand(outputs.shape), outputs,
                                                       dim, reverse, initial, cu_seqlens, log_coeffs)
        return d_inputs, _reduce_to(d_coeffs, coeffs), d_initial
    if not direct((d_outputs, coeffs, outputs, initial, cu_seqlens)):
        return kernels.backward(d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs)
    if records((d_outputs, coeffs, outputs, initial)):
        options = (kernels, dim, reverse, log_coeffs, 0, 0)
        return _Backward.apply(d_outputs, coeffs, outputs, initial, cu_seqlens, options)
    with torch._C._AutoDispatchBelowAutograd():
        return kernels.backward(d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs)


def autograd_kernel(keyset: torch._C.DispatchKeySet, function: type[_SingleLevelFunction], arguments: tuple,
                    differentiable: tuple[torch.Tensor | None, ...], op: torch._ops.OpOverload,
                    op_arguments: tuple):
    """The Autograd kernel of an op whose derivatives ``function`` holds, called with the op's keyset:
    under a torch.func transform or forward-mode AD, ``function.apply(*arguments)`` at the transform's
    level; at the plain autograd level, the same where the call records a node (gradients enabled and a
    ``differentiable`` tensor requiring one), else the op's kernels below the Autograd key on
    ``op_arguments``."""
    if not plain_autograd():
        with enable_single_level_autograd_function():
            return function.apply(*arguments)
    if records(differentiable):
        return function.apply(*arguments)
    return op.redispatch(keyset & _BELOW_AUTOGRAD, *op_arguments)


def _register_autograd(kernels: Kernels) -> None:
    """Registers the Autograd kernels of one family's two ops."""

    def forward_autograd(keyset, inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None,
                         log_coeffs=False, *config):
        options = (kernels, dim, reverse, log_coeffs, *(config or (0, 0)))
        return autograd_kernel(keyset, _Forward, (inputs, coeffs, initial, cu_seqlens, options),
                               (inputs, coeffs, initial), kernels.forward,
                               (inputs, coeffs, dim, reverse, initial, cu_seqlens, log_coeffs, *options[4:]))

    def backward_autograd(keyset, d_outputs, coeffs, outputs, dim=-1, reverse=False, initial=None, cu_seqlens=None,
                          log_coeffs=False, *config):
        options = (kernels, dim, reverse, log_coeffs, *(config or (0, 0)))
        return autograd_kernel(keyset, _Backward, (d_outputs, coeffs, outputs, initial, cu_seqlens, options),
                               (d_outputs, coeffs, outputs, initial), kernels.backward,
                               (d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs,
                                *options[4:]))

    # Registered on the Autograd key rather than through torch.library.register_autograd, whose generated
    # Function has neither a jvp (forward-mode tangents were dropped) nor a setup_context (torch.func refused
    # it); torch.compile still sees the op itself, not these Functions.
    _LIBRARY.impl(kernels.forward.name().split("::")[1], forward_autograd, "Autograd", with_keyset=True)
    _LIBRARY.impl(kernels.backward.name().split("::")[1], backward_autograd, "Autograd", with_keyset=True)


for _family in (COMPILED, TRITON):
    _register_autograd(_family)
