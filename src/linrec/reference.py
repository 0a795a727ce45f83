"""Pure-PyTorch linear recurrences: the ground truth for tests and the baselines for benchmarks.

Each recurrence takes time-last tensors of one shape, ``(inputs, coeffs, reverse) -> outputs``,
computes ``outputs[0] = inputs[0]`` and ``outputs[l] = coeffs[l] * outputs[l-1] + inputs[l]`` (the
first coefficient takes no part), and is differentiable through autograd. 16-bit inputs are computed
in float32 and the result is cast back; their coefficients may be float32 (mixed precision), read as
they are, and autograd returns each gradient in its argument's dtype. ``linrec_reference`` builds the
full API on any of them (time dim, broadcasting, initial state, packed sequences, log coefficients) in
the plainest way.
"""

from __future__ import annotations

from typing import Callable

import torch

Recurrence = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """16-bit types compute in float32; the others as they are. Coefficients and initial states, of the
    inputs' dtype or float32 with 16-bit inputs, are exact in it."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def linrec_loop(inputs: torch.Tensor, coeffs: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """One step per time index, vectorized over the leading dims. Slow for long sequences, exact."""
    dtype = compute_dtype(inputs.dtype)
    steps = range(inputs.shape[-1] - 1, -1, -1) if reverse else range(inputs.shape[-1])
    # The steps as views taken at once: the backward of one unbind stacks the steps' gradients, where the
    # backward of a view per step would write each into a zeroed tensor of the whole (time x size).
    input_steps, coeff_steps = inputs.unbind(-1), coeffs.unbind(-1)
    outputs = []
    for step, l in enumerate(steps):
        x = input_steps[l].to(dtype)
        outputs.append(x if step == 0 else coeff_steps[l].to(dtype) * outputs[-1] + x)
    if not outputs:
        return inputs.clone()  # empty, but part of the autograd graph like any other result
    if reverse:
        outputs.reverse()
    return torch.stack(outputs, dim=-1).to(inputs.dtype)


def _combine(earlier: tuple[torch.Tensor, torch.Tensor], later: tuple[torch.Tensor, torch.Tensor]):
    # Composing y -> c1*y + x1 with y -> c2*y + x2 gives y -> (c2*c1)*y + (c2*x1 + x2).
    coeff_earlier, input_earlier = earlier
    coeff_later, input_later = later
    return coeff_later * coeff_earlier, coeff_later * input_earlier + input_later


def linrec_hop(inputs: torch.Tensor, coeffs: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """torch's associative_scan higher-order op over (coeff, input) pairs, O(log L) depth."""
    from torch._higher_order_ops.associative_scan import associative_scan

    if inputs.shape[-1] == 0:
        return inputs.clone()  # empty, but part of the autograd graph like any other result
    dtype = compute_dtype(inputs.dtype)
    _, outputs = associative_scan(
        _combine, (coeffs.to(dtype), inputs.to(dtype)), dim=inputs.dim() - 1, reverse=reverse, combine_mode="generic"
    )
    return outputs.to(inputs.dtype)


def linrec_heinsen(inputs: torch.Tensor, coeffs: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Heinsen's log-space form: two prefix sums (cumsum and logcumsumexp) over complex logarithms,
    so negative values work. Loses precision when the coefficients' cumulative product under- or
    overflows, and is undefined for zero coefficients."""
    if reverse:
        return linrec_heinsen(inputs.flip(-1), coeffs.flip(-1)).flip(-1)
    if inputs.shape[-1] == 0:
        return inputs.clone()  # empty, but part of the autograd graph like any other result
    complex_dtype = torch.complex128 if inputs.dtype in (torch.float64, torch.complex128) else torch.complex64
    log_coeffs = torch.log(coeffs.to(complex_dtype))
    # The first coefficient takes no part: replace its log by log(1) = 0.
    log_coeffs = torch.cat([torch.zeros_like(log_coeffs[..., :1]), log_coeffs[..., 1:]], dim=-1)
    log_cumulative_coeffs = torch.cumsum(log_coeffs, dim=-1)
    log_outputs = log_cumulative_coeffs + torch.logcumsumexp(
        torch.log(inputs.to(complex_dtype)) - log_cumulative_coeffs, dim=-1
    )
    outputs = torch.exp(log_outputs)
    return (outputs if inputs.is_complex() else outputs.real).to(inputs.dtype)


def linrec_reference(
    recurrence: Recurrence,
    inputs: torch.Tensor,
    coeffs: torch.Tensor,
    dim: int = -1,
    reverse: bool = False,
    initial: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    log_coeffs: bool = False,
) -> torch.Tensor:
    """``linrec.linrec``'s semantics on a time-last recurrence: exponentiates log coefficients, expands
    broadcast coefficients, folds the initial state into the first input (``coeffs[first] * initial +
    inputs[first]``) and runs each packed sequence of ``cu_seqlens`` on its own. Arguments are assumed
    checked (``linrec.linrec`` does that)."""
    dtype = compute_dtype(inputs.dtype)
    inputs_last = inputs.to(dtype).movedim(dim, -1)
    coeffs_last = coeffs.to(dtype).expand(inputs.shape).movedim(dim, -1)
    length = inputs_last.shape[-1]
    bounds = [0, length] if cu_seqlens is None else cu_seqlens.tolist()
    pieces = []
    for segment, (begin, end) in enumerate(zip(bounds, bounds[1:])):
        if begin == end:
            continue
        x, c = inputs_last[..., begin:end], coeffs_last[..., begin:end]
        first = end - begin - 1 if reverse else 0
        if log_coeffs:
            if initial is None:
                # The first coefficient takes no part: its gradient is 0, also where exp(NaN or Inf) would
                # turn autograd's 0 into NaN.
                unused = torch.zeros(c.shape[-1], dtype=torch.bool, device=c.device)
                unused[first] = True
                c = torch.where(unused, torch.zeros_like(c), c)
            c = c.exp()
        if initial is not None:
            state = initial.to(dtype) if cu_seqlens is None else initial[segment : segment + 1].to(dtype)
            folded = c[..., first : first + 1] * state.unsqueeze(-1) + x[..., first : first + 1]
            x = torch.cat([folded, x[..., 1:]] if not reverse else [x[..., :-1], folded], dim=-1)
        pieces.append(recurrence(x, c, reverse))
    if not pieces:  # no steps: still part of the autograd graph
        return recurrence(inputs_last, coeffs_last, reverse).movedim(-1, dim).to(inputs.dtype)
    outputs = torch.cat(pieces, dim=-1)
    return outputs.movedim(-1, dim).to(inputs.dtype)


#: The reference implementations by name, as ``linrec.linrec(..., backend=name)`` selects them.
REFERENCES: dict[str, Recurrence] = {"loop": linrec_loop, "hop": linrec_hop, "heinsen": linrec_heinsen}
