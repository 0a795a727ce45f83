"""Mamba's selective scan (S6) on linrec's recurrence.

The state ``x`` of shape (batch, d, n) evolves as ``x_t = exp(delta_t * A) * x_{t-1} + delta_t * B_t * u_t``
and is read out as ``y_t = sum_n C_t * x_t``. The fused ops (``_core/selective_scan.py``, kernels in
``csrc/include/linrec/ssm/``) keep the state on chip. The composed scan uses that each (batch, d, n) entry
of the state is an independent linear recurrence over time: the whole scan is one ``linrec.linrec`` call on
the expanded operands of shape (batch, d, n, length), laid out with time last and contiguous (the rows
the kernels scan fastest). For real ``A`` its coefficients are passed as ``delta * A`` with
``log_coeffs=True``: the kernels exponentiate, and no tensor of ``exp(delta * A)`` is stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._core.checks import (
    REAL_DTYPES,
    as_bool,
    check_device,
    check_dtype,
    check_tensor,
    packed_sequences,
)
from ._core.selective_scan import as_operand, compute_dtypes, fused, runs_fused
from .scan import BACKENDS, final_states, linrec

__all__ = ["SELECTIVE_SCAN_BACKENDS", "selective_scan"]

_OP = "linrec.selective_scan"
#: "auto" and "composed" run linrec's compiled kernels (fused where they apply); the others the composed scan
#: on linrec.linrec's backend of that name.
SELECTIVE_SCAN_BACKENDS = ("auto", "composed", *(name for name in BACKENDS if name != "auto"))
_COMPLEX = (torch.complex64, torch.complex128)
# The largest n of the GPU's lane kernels (csrc/include/linrec/ssm/lanes/policy.cuh: kMaxStates).
_LANE_MAX_STATES = 128


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    *,
    initial: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan (S6), with the arguments and results of mamba_ssm's ``selective_scan_fn``,
    and, beyond them, an initial state and packed sequences.

    With ``delta`` first shifted by ``delta_bias`` and passed through softplus when ``delta_softplus``,
    the state ``x`` (batch, d, n) starts at ``initial`` (zero without it) and, for every step ``t``
    (elementwise over (d, n))::

        x_t = exp(delta_t * A) * x_{t-1} + delta_t * B_t * u_t
        y_t = sum over n of x_t * C_t            (2 * its real part when A is complex)
        out_t = (y_t + D * u_t) * silu(z_t)      (the D and z terms only when given)

    Computed in float32 at least: 16-bit arguments are read as float32 (state, products and sums in
    float32), float64 ones keep float64. Differentiable in every tensor argument.

    On the CPU or a GPU the build's CUDA kernels run on, with a real or a complex ``A``, the scan runs fused
    (``backend="auto"``): the state stays on chip, u, delta, z, B and C are read once and the output
    written once; only the state every 512 steps is kept for the backward, which recomputes the rest.
    Memory is then O(batch * d * length). The fused kernels give first derivatives. Under
    ``torch.use_deterministic_algorithms(True)`` the fused backward on the GPU sums a time-varying B's and
    C's gradients in a fixed order (each block of channels' sums kept apart, then added in block order)
    where both vary with the same groups and n <= 128 in float32 with a real ``A``; other time-varying calls
    on the GPU, whose fused gradient would be summed with atomic adds, take the composed scan then. Otherwise
    (``backend="composed"``, or that deterministic case), the scan is one ``linrec.linrec`` call over
    the expanded state, which takes memory: its coefficients, inputs and states are each
    batch * d * n * length elements of the compute dtype, and autograd keeps the states for the
    backward. The composed scan has derivatives of every order, and is what runs under ``torch.func``
    transforms (``grad``, ``vmap``, ``jvp``, ``jacrev``, ...) and forward-mode AD.

    Args:
        u: the inputs, (batch, d, length), float32, float64, float16 or bfloat16.
        delta: the step sizes, (batch, d, length), real.
        A: the state matrix, (d, n), real or complex (complex64/complex128: complex state).
        B: the input projection, in one of three layouts: fixed ``(d, n)``; one per (batch, time) shared
            by the channels ``(batch, n, length)``; or per group of channels ``(batch, groups, n,
            length)``, where ``groups`` divides d and channel k reads group ``k // (d // groups)``.
            With complex ``A``, a time-varying B is real with a last dim of ``2 * length`` holding
            (real, imag) pairs, as mamba_ssm takes it (a complex one of ``length`` is read as it is);
            a fixed B is complex or real. With real ``A``, B is real.
        C: the output projection, in the layouts of ``B`` (independently of B's).
        D: the skip connection, (d,), real, or None.
        z: the gate, (batch, d, length), real, or None: the output is multiplied by ``silu(z)``.
        delta_bias: (d,), real, added to ``delta`` before the softplus, or None.
        delta_softplus: pass ``delta`` (after ``delta_bias``) through softplus.
        return_last_state: also return the state after the last step (of every sequence, with
            ``cu_seqlens``).
        initial: keyword-only, the state before the first step, (batch, d, n), or (sequences, d, n) with
            ``cu_seqlens``; real, or complex when ``A`` is; differentiable. None: zeros.
        cu_seqlens: keyword-only, packed variable-length sequences along the length, as
            ``linrec.linrec`` takes them: int32 or int64 offsets ``[0, end_0, ..., length]``
            (non-decreasing) with a batch of 1. The state restarts at each sequence's start (from its
            row of ``initial``), and no gradient crosses a boundary.
        backend: ``"auto"`` (the fused kernels where they apply, else the composed scan on linrec's compiled
            kernels), ``"composed"`` (the composed scan on the compiled kernels), or the composed scan on a
            pure-PyTorch reference of ``linrec.linrec``: ``"loop"``, ``"hop"`` or ``"heinsen"``.

    Returns:
        out, (batch, d, length) of ``u``'s dtype; with ``return_last_state``, the tuple
        ``(out, last_state)``, where last_state is (batch, d, n), or (sequences, d, n) with
        ``cu_seqlens``, in the compute dtype (float32 or float64; complex64 or complex128 when ``A``
        is complex), and differentiable: an empty sequence's is its initial state (zeros without one).

    Example:
        >>> batch, d, n, length = 2, 8, 4, 32
        >>> u, delta = torch.randn(batch, d, length), torch.rand(batch, d, length)
        >>> A = -torch.rand(d, n)                                # decaying state
        >>> B, C = torch.randn(batch, n, length), torch.randn(batch, n, length)
        >>> out, state = selective_scan(u, delta, A, B, C, D=torch.ones(d), return_last_state=True)
        >>> out.shape, state.shape
        (torch.Size([2, 8, 32]), torch.Size([2, 8, 4]))
    """
    if backend not in SELECTIVE_SCAN_BACKENDS:
        raise ValueError(f"{_OP}: backend must be one of {', '.join(map(repr, SELECTIVE_SCAN_BACKENDS))}, got {backend!r}")
    delta_softplus = as_bool(_OP, "delta_softplus", delta_softplus)
    return_last_state = as_bool(_OP, "return_last_state", return_last_state)
    batch, d, n, length = _check(u, delta, A, B, C, D, z, delta_bias, initial, cu_seqlens)
    real_dtype, state_dtype = compute_dtypes(u, delta, A, B, C, D, z, delta_bias, initial)
    complex_state = A.is_complex()
    if runs_fused(backend, u.device, _sums_in_fixed_order(A, B, C, real_dtype)):
        out, last_state = fused(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial,
                                None if cu_seqlens is None else cu_seqlens.contiguous(), real_dtype, state_dtype)
        return (out, last_state) if return_last_state else out

    # The small operands are made contiguous (they hold no n dim), so that the products below come out
    # as (batch, d, n, length) with time last and contiguous, whatever the strides of the arguments.
    u_wide = u.to(real_dtype).contiguous()
    delta_wide = delta.to(real_dtype).contiguous()
    if delta_bias is not None:
        delta_wide = delta_wide + delta_bias.to(real_dtype).unsqueeze(-1)
    if delta_softplus:
        delta_wide = F.softplus(delta_wide)
    A_wide = A.to(state_dtype).contiguous()
    B_wide = as_operand(B, state_dtype, length)
    C_wide = as_operand(C, state_dtype, length)

    step = delta_wide.unsqueeze(2) * A_wide.unsqueeze(-1)  # delta_t * A, (batch, d, n, length)
    if complex_state:
        coeffs, log_coeffs = step.exp(), False
    else:
        coeffs, log_coeffs = step, True  # the kernels take exp(delta * A) from its log
    inputs = _spread(delta_wide * u_wide, B_wide)  # delta_t * B_t * u_t, (batch, d, n, length)
    start = None if initial is None else initial.to(state_dtype)
    states = linrec(inputs, coeffs.contiguous(), dim=-1, initial=start, cu_seqlens=cu_seqlens, log_coeffs=log_coeffs,
                    backend="auto" if backend == "composed" else backend)

    y = _contract(states, C_wide)  # (batch, d, length)
    if complex_state:
        y = 2 * y.real
    if D is not None:
        y = y + u_wide * D.to(real_dtype).unsqueeze(-1)
    if z is not None:
        y = y * F.silu(z.to(real_dtype))
    out = y.to(u.dtype)
    if not return_last_state:
        return out
    return out, final_states(states, cu_seqlens, dim=3, reverse=False, initial=start)


def _sums_in_fixed_order(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, real_dtype: torch.dtype) -> bool:
    """Whether the fused backward on the GPU can sum the gradients of B and C in a fixed order: both fixed, or
    both varying with the same groups (shared: one), n <= _LANE_MAX_STATES, a real A and a float32 state,
    which the lane kernels take (csrc/include/linrec/ssm/lanes/policy.cuh: takes, kMaxStates)."""
    if B.dim() == 2 and C.dim() == 2:
        return True
    if A.is_complex():
        return False
    groups = [1 if M.dim() == 3 else M.shape[1] for M in (B, C) if M.dim() > 2]
    return (len(groups) == 2 and groups[0] == groups[1] and A.shape[1] <= _LANE_MAX_STATES
            and real_dtype == torch.float32)


def _spread(delta_u: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """delta_u (batch, d, length) times B over the state dim n: (batch, d, n, length)."""
    batch, d, length = delta_u.shape
    if B.dim() == 2:
        product = delta_u.unsqueeze(2) * B.unsqueeze(-1)
    else:
        groups, n = B.shape[1], B.shape[2]
        product = delta_u.view(batch, groups, d // groups, 1, length) * B.unsqueeze(2)
        product = product.reshape(batch, d, n, length)
    return product.contiguous()


def _contract(states: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """sum over n of states (batch, d, n, length) times C: (batch, d, length)."""
    if C.dim() == 2:
        return (states * C.unsqueeze(-1)).sum(2)
    batch, d, n, length = states.shape
    groups = C.shape[1]
    grouped = states.view(batch, groups, d // groups, n, length) * C.unsqueeze(2)
    return grouped.sum(3).reshape(batch, d, length)


def _shape(tensor: torch.Tensor) -> str:
    return str(list(tensor.shape))


def _check(u, delta, A, B, C, D, z, delta_bias, initial, cu_seqlens) -> tuple[int, int, int, int]:
    """Checks every tensor argument; returns (batch, d, n, length). Raises TypeError (types, dtypes) or
    ValueError (shapes, devices) naming the argument, what was expected and what was given."""
    named = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias,
             "initial": initial}
    for name, tensor in named.items():
        if tensor is not None or name in ("u", "delta", "A", "B", "C"):
            check_tensor(_OP, name, tensor)
    for name, tensor in named.items():
        if tensor is None:
            continue
        if name in ("A", "B", "C", "initial"):
            check_dtype(_OP, name, tensor, REAL_DTYPES + _COMPLEX, "a real or complex floating-point tensor")
        else:
            check_dtype(_OP, name, tensor, REAL_DTYPES, "a real floating-point tensor")
        check_device(_OP, name, tensor, "u", u.device)

    if u.dim() != 3:
        raise ValueError(f"{_OP}: u must be 3-dim (batch, d, length), got shape {_shape(u)}")
    batch, d, length = u.shape
    for name in ("delta", "z"):
        if named[name] is not None and named[name].shape != u.shape:
            raise ValueError(f"{_OP}: {name} must have the shape of u (batch, d, length) = {_shape(u)}, "
                             f"got {_shape(named[name])}")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"{_OP}: A must be 2-dim (d, n) with d = {d} (u's dim 1), got shape {_shape(A)}")
    n = A.shape[1]
    for name in ("D", "delta_bias"):
        if named[name] is not None and named[name].shape != (d,):
            raise ValueError(f"{_OP}: {name} must have shape (d,) = [{d}], got {_shape(named[name])}")

    complex_state = A.is_complex()
    sequences = packed_sequences(_OP, cu_seqlens, "u", u)
    if initial is not None:
        if initial.is_complex() and not complex_state:
            raise TypeError(f"{_OP}: initial is complex ({initial.dtype}) but A is real ({A.dtype}): "
                            "a complex state needs a complex A")
        rows = "sequences (cu_seqlens' offsets - 1)" if cu_seqlens is not None else "batch"
        if list(initial.shape) != [sequences, d, n]:
            raise ValueError(f"{_OP}: initial must have shape ({rows}, d, n) = {[sequences, d, n]}, "
                             f"got {_shape(initial)}")
    for name, M in (("B", B), ("C", C)):
        if M.is_complex() and not complex_state:
            raise TypeError(f"{_OP}: {name} is complex ({M.dtype}) but A is real ({A.dtype}): "
                            "a complex B or C needs a complex A")
        if M.dim() == 2:
            if M.shape != (d, n):
                raise ValueError(f"{_OP}: a fixed {name} must have the shape of A (d, n) = {_shape(A)}, "
                                 f"got {_shape(M)}")
            continue
        if M.dim() not in (3, 4):
            raise ValueError(f"{_OP}: {name} must be (d, n), (batch, n, length) or (batch, groups, n, length), "
                             f"got {M.dim()} dims, shape {_shape(M)}")
        time_size = 2 * length if complex_state and not M.is_complex() else length
        expected = [batch, n, time_size] if M.dim() == 3 else [batch, M.shape[1], n, time_size]
        if list(M.shape) != expected:
            layout = "(batch, n, length)" if M.dim() == 3 else "(batch, groups, n, length)"
            pairs = (f", its last dim holding 2 * length = {2 * length} interleaved (real, imag) values as A is complex"
                     if time_size != length else "")
            raise ValueError(f"{_OP}: {name} must be {layout} = {expected}{pairs}, got {_shape(M)}")
        if M.dim() == 4:
            groups = M.shape[1]
            if groups == 0 or d % groups != 0:
                raise ValueError(f"{_OP}: the groups of {name} (its dim 1, {groups}) must divide d = {d}, "
                                 f"got shape {_shape(M)}")
    return batch, d, n, length
