"""Sequence parallelism: one recurrence whose time dim is split across the ranks of a ``torch.distributed``
process group (context-parallel training of sequences longer than one device holds).

The ranks hold consecutive chunks of the sequence in rank order. A chunk's effect on the state is one
affine map ``h -> A * h + b`` (``A`` the product of its coefficients, ``b`` its final state from zero), so
the ranks exchange one map each, compose the maps of the chunks before their own, and scan their chunk
from that incoming state:

- forward: every chunk but the last computes its map (the first one scanning from ``initial``: its
  outputs are then final); one ``all_gather`` of the maps; every chunk but the first scans again from
  its incoming state;
- backward: the gradient carries flow the other way. Every chunk but the first runs the backward op from
  no incoming gradient, whose ``d_initial`` is its chunk's map of the gradient; one ``all_gather``; every
  chunk but the last runs the backward op again with the gradient arriving from the later chunks added
  at its last step.

The composition of the gathered maps is itself a recurrence over the ranks, one small kernel call. The
communication per call is the gathered maps, ``O(ranks x state size)``, plus a fixed-size check that the
ranks' chunks line up (shapes, dtypes, device type, arguments), never the data.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import _SingleLevelFunction

from ._core.backend import choose
from ._core.autograd import (
    autograd_kernel,
    below_this_level,
    check_single_forward_mode_level,
    forward_tangent_operand,
    save_for_forward,
)
from ._core.checks import SUPPORTED_DTYPES, check_arguments, initial_shape, type_name, typed_arguments
from ._core.steps import previous_step
from .reference import compute_dtype  # the maps are composed in the kernels' accumulation type

__all__ = ["linrec"]

_OP = "linrec.distributed.linrec"
#: The most dims the ranks' shapes are compared over (the check exchanges a fixed-size record).
MAX_DIMS = 16
_DEVICE_TYPES = ("cpu", "cuda")
# all_gather_single is all_gather_into_tensor's name from torch 2.13 on (neither exists in a torch built
# without torch.distributed, where the call raises before it needs one).
_all_gather_into = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def linrec(
    inputs: torch.Tensor,
    coeffs: torch.Tensor | float,
    dim: int = -1,
    reverse: bool = False,
    initial: torch.Tensor | None = None,
    log_coeffs: bool = False,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``linrec.linrec`` over one sequence split along ``dim`` across the ranks of ``group``.

    Rank ``r`` of the group holds the ``r``-th chunk of the sequence along ``dim`` (chunks of any lengths,
    0 included); the other dims, the dtypes, the device type and the other arguments must agree on every
    rank. Each rank gets the outputs of its own chunk: exactly what one ``linrec.linrec`` call on the
    concatenated sequence computes there. Every rank of the group must make the call (and its backward),
    like any collective. With float16 or bfloat16 inputs, coeffs and initial may be float32 (mixed
    precision, as ``linrec.linrec`` takes them).

    Args:
        inputs: this rank's chunk of the additive terms.
        coeffs: this rank's chunk of the coefficients, or coefficients that broadcast along time (size 1
            along ``dim``, or fewer dims, a Python number among them), shared by every rank.
        dim: the time dim.
        reverse: the recurrence runs from the last rank's last step to the first rank's first step.
        initial: the state before the whole sequence's first step, passed on every rank (the first
            chunk's rank, the last one with ``reverse``, uses its value).
        log_coeffs: ``coeffs`` hold ``log c``.
        group: the process group; the default group when None.

    Returns:
        this rank's chunk of the outputs.

    Gradients are rank-local: ``inputs`` and per-step ``coeffs`` get the gradient of this rank's chunk.
    Tensors every rank shares, a broadcast ``coeffs`` and ``initial``, get this rank's part of their
    gradient; summed over the group (``all_reduce``, as data and context parallel training already do for
    shared parameters) they are the gradient. Forward-mode AD and first-order ``torch.func`` transforms
    work; second derivatives raise ``NotImplementedError``.
    """
    group = _process_group(group)
    try:
        coeffs, dim, reverse, log_coeffs = typed_arguments(_OP, inputs, coeffs, dim, reverse, initial, None,
                                                           log_coeffs)
    except TypeError as problem:  # the op cannot take these: the other ranks still wait in the check
        if not torch.compiler.is_compiling():
            _agree(problem, _local_record(None), _exchange_device(inputs, group), group)
        raise
    return _FORWARD(inputs, coeffs, initial, dim, reverse, log_coeffs, group.group_name)[0]


def _process_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    if not dist.is_available():
        raise RuntimeError(f"{_OP}: this build of torch has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(f"{_OP}: torch.distributed is not initialized: call torch.distributed.init_process_group first")
    if group is None:
        return dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"{_OP}: this rank is not a member of group (torch.distributed.new_group left it out)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{_OP}: group must be a torch.distributed.ProcessGroup or None, got {type_name(group)}")
    return group


def _resolve(group_name: str) -> dist.ProcessGroup:
    """The group the ops name (ops take strings, not process groups), as torch's functional collectives do."""
    return dist.distributed_c10d._resolve_process_group(group_name)


# ----- the check that the ranks' chunks line up ---------------------------------------------------------

# The record each rank contributes: a refusal flag, then these fields, then the two shapes.
_FIELDS = ("dims of inputs", "time dim", "reverse", "log_coeffs", "initial given", "dtype", "coeffs' dtype",
           "initial's dtype", "device type")
_DTYPE_FIELDS = ("dtype", "coeffs' dtype", "initial's dtype")
# coeffs' size along time: broadcast along time, one per step, or either (a chunk of length 1).
_BROADCAST, _PER_STEP, _EITHER = 1, -1, 0
_ABSENT = -2  # a dim beyond the tensor's


def _local_record(arguments: tuple | None) -> list[int]:
    """This rank's record; all zeros after a local refusal (the flag says so)."""
    size = 1 + len(_FIELDS) + 2 * MAX_DIMS
    if arguments is None:
        return [1] + [0] * (size - 1)
    inputs, coeffs, dim, reverse, initial, log_coeffs = arguments
    ndim, length = inputs.dim(), inputs.shape[dim]
    shape = [_PER_STEP if d == dim else size for d, size in enumerate(inputs.shape)]
    aligned = [1] * (ndim - coeffs.dim()) + list(coeffs.shape)
    steps = aligned[dim]
    aligned[dim] = _EITHER if steps == length == 1 else (_BROADCAST if steps == 1 else _PER_STEP)
    pad = [_ABSENT] * (MAX_DIMS - ndim)
    # Without initial its dtype is recorded as inputs' ("initial given" tells the ranks apart first).
    dtypes = (inputs.dtype, coeffs.dtype, inputs.dtype if initial is None else initial.dtype)
    fields = [ndim, dim, reverse, log_coeffs, initial is not None, *map(SUPPORTED_DTYPES.index, dtypes),
              _DEVICE_TYPES.index(inputs.device.type)]
    return [0, *map(int, fields), *shape, *pad, *aligned, *pad]


def _describe(field: str, value: list[int]) -> str:
    if field in _DTYPE_FIELDS:
        return str(SUPPORTED_DTYPES[value[0]])
    if field == "device type":
        return _DEVICE_TYPES[value[0]]
    if field in ("inputs' shape", "coeffs' shape"):
        names = {_PER_STEP: "T", _BROADCAST: "1", _EITHER: "1 or T"} if field == "coeffs' shape" else {_PER_STEP: "T"}
        return "(" + ", ".join(names.get(size, str(size)) if d == value[-1] else str(size)
                               for d, size in enumerate(value[:-1]) if size != _ABSENT) + ")"
    return str(bool(value[0])) if field in ("reverse", "log_coeffs", "initial given") else str(value[0])


def _compared(records: list[list[int]]) -> dict[str, list[list[int]]]:
    """Each record's fields, one list per field over the ranks; the shapes end with the time dim's index."""
    width = 1 + len(_FIELDS)
    fields = {name: [[record[1 + i]] for record in records] for i, name in enumerate(_FIELDS)}
    fields["inputs' shape"] = [record[width:width + MAX_DIMS] + [record[2]] for record in records]
    fields["coeffs' shape"] = [record[width + MAX_DIMS:] + [record[2]] for record in records]
    return fields


def _agree(problem: Exception | None, record: list[int], device: torch.device, group: dist.ProcessGroup) -> None:
    """Exchanges the ranks' records and raises on every rank unless all of them can run the call: a rank
    that refused its arguments raises its own error, the others name it; chunks that do not line up raise
    a ValueError naming the first field that differs. Nothing else is exchanged until they agree."""
    records = _gather(torch.tensor(record, dtype=torch.int64, device=device), group).tolist()
    refused = [rank for rank, each in enumerate(records) if each[0]]
    if problem is not None:
        raise problem
    if refused:
        raise RuntimeError(f"{_OP}: rank(s) {refused} of the group refused their arguments (their errors say why); "
                           "every rank of the group raises")
    for field, values in _compared(records).items():
        if field == "coeffs' shape":  # a chunk of length 1 matches either kind of coeffs
            kinds = {value[value[-1]] for value in values} - {_EITHER}
            steps = [value[:value[-1]] + value[value[-1] + 1:] for value in values]
            if len(kinds) < 2 and all(each == steps[0] for each in steps):
                continue
        elif all(value == values[0] for value in values):
            continue
        other = next(rank for rank, value in enumerate(values) if value != values[0])
        raise ValueError(
            f"{_OP}: the chunks of the group's ranks do not line up: {field} {_describe(field, values[0])} on "
            f"rank 0 but {_describe(field, values[other])} on rank {other} (all dims but the time dim, the "
            "dtypes, the device type and the arguments must agree)"
        )


def _exchange_device(inputs: object, group: dist.ProcessGroup) -> torch.device:
    """Where the check's record goes: the inputs' device, or the device the group's backend serves."""
    if isinstance(inputs, torch.Tensor) and inputs.device.type in _DEVICE_TYPES:
        return inputs.device
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _checked(inputs, coeffs, initial, dim, reverse, log_coeffs, group):
    """Checks this rank's arguments and that the ranks agree (raising on every rank otherwise); returns dim
    in [0, ndim) and the kernels that run this rank's chunk."""
    problem, record, kernels = None, None, None
    try:
        dim = check_arguments(_OP, inputs, coeffs, dim, initial, None, log_coeffs)
        if inputs.dim() > MAX_DIMS:
            raise ValueError(f"{_OP}: inputs must have at most {MAX_DIMS} dims, got {inputs.dim()}")
        if inputs.device.type not in _DEVICE_TYPES:
            raise ValueError(f"{_OP}: inputs must be on a cpu or cuda device, got {inputs.device}")
        kernels = choose("auto", inputs)
        record = _local_record((inputs, coeffs, dim, reverse, initial, log_coeffs))
    except (TypeError, ValueError, IndexError, RuntimeError) as error:
        problem = error
    _agree(problem, record or _local_record(None), _exchange_device(inputs, group), group)
    return dim, kernels


# ----- the ops --------------------------------------------------------------------------------------------

_LIBRARY = torch.library.Library("linrec", "FRAGMENT")
_LIBRARY.define(
    "sequence_parallel_forward(Tensor inputs, Tensor coeffs, Tensor? initial, int dim, bool reverse, "
    "bool log_coeffs, str group_name) -> (Tensor, Tensor)"
)
_LIBRARY.define(
    "sequence_parallel_backward(Tensor d_outputs, Tensor coeffs, Tensor outputs, Tensor? initial, Tensor carries, "
    "int dim, bool reverse, bool log_coeffs, str group_name) -> (Tensor, Tensor, Tensor)"
)


def _position(group: dist.ProcessGroup, reverse: bool) -> tuple[int, int, int]:
    """(this rank, the group's size, this rank's chunk's place in the scan's order)."""
    rank, world = group.rank(), group.size()
    return rank, world, world - 1 - rank if reverse else rank


def _gather(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(group size, *local.shape): every rank's ``local``, in rank order (gathered flat: gloo takes the
    concatenated form only)."""
    flat = local.reshape(-1)
    gathered = flat.new_empty(group.size() * flat.shape[0])
    real = torch.view_as_real if flat.is_complex() else (lambda tensor: tensor)
    _all_gather_into(real(gathered), real(flat), group=group)
    return gathered.view(group.size(), *local.shape)


def _rank_at(position: int, world: int, reverse: bool) -> int:
    """The rank holding the chunk at ``position`` in the scan's order."""
    return world - 1 - position if reverse else position


def _nonfinite_positions(leaving: torch.Tensor, reverse: bool) -> list[int]:
    """The places in scan order of the chunks whose composed state (or gradient) holds a non-finite value.

    Composed through products of coefficients, such a value may differ from the loop's: a product that
    underflows to 0 turns an infinite state NaN, one that overflows turns a tiny state infinite. From the
    first such chunk on, the states are passed from rank to rank instead, each the end of its chunk's scan
    (which gives the loop's answer), one rank after the other. Every rank computes the same list from the
    same gathered maps, so they agree on it without a message."""
    finite = torch.isfinite(leaving.reshape(leaving.shape[0], -1)).all(1)
    by_position = finite.flip(0) if reverse else finite
    return (~by_position).nonzero().flatten().tolist()


def _point_to_point_device(state: torch.Tensor, group: dist.ProcessGroup) -> torch.device:
    """Where a state travels between two ranks: its own device, or the CPU for CUDA tensors in a group
    without NCCL (gloo sends and receives CPU tensors only)."""
    return state.device if state.device.type != "cuda" or "nccl" in str(dist.get_backend(group)) else torch.device("cpu")


def _send(state: torch.Tensor, group: dist.ProcessGroup, rank: int) -> None:
    travelling = state.to(_point_to_point_device(state, group)).contiguous()
    dist.send(torch.view_as_real(travelling) if travelling.is_complex() else travelling,
              dst=dist.get_global_rank(group, rank), group=group)


def _receive(like: torch.Tensor, group: dist.ProcessGroup, rank: int) -> torch.Tensor:
    state = torch.empty_like(like, memory_format=torch.contiguous_format, device=_point_to_point_device(like, group))
    dist.recv(torch.view_as_real(state) if state.is_complex() else state, src=dist.get_global_rank(group, rank),
              group=group)
    return state.to(like.device)


def _coeff_product(inputs: torch.Tensor, coeffs: torch.Tensor, dim: int, log_coeffs: bool) -> torch.Tensor:
    """The product of this chunk's coefficients along time, in the state's shape and the carry dtype."""
    dtype, length = compute_dtype(inputs.dtype), inputs.shape[dim]
    aligned = coeffs.reshape((1,) * (inputs.dim() - coeffs.dim()) + tuple(coeffs.shape))
    if aligned.shape[dim] == 1 and length != 1:  # one coefficient for every step
        step = aligned.select(dim, 0).to(dtype)
        product = (step * length).exp() if log_coeffs else step ** length
    else:
        product = aligned.sum(dim, dtype=dtype).exp() if log_coeffs else aligned.prod(dim, dtype=dtype)
    return product.expand(initial_shape(inputs, dim, None))


def _state_dtype(values: torch.Tensor, coeffs: torch.Tensor, initial: torch.Tensor | None) -> torch.dtype:
    """The dtype a chunk passes its incoming state to the op in: the one the kernels read coeffs and initial
    in, float32 where either is float32 with 16-bit ``values`` (mixed precision), else values'. In values'
    dtype under float32 coeffs it would lose the precision they keep; in float32 under 16-bit coeffs and
    no float32 initial, the op would convert (copy) coeffs for it."""
    mixed = coeffs.dtype != values.dtype or (initial is not None and initial.dtype != values.dtype)
    return torch.float32 if mixed else values.dtype


def _incoming(initial: torch.Tensor | None, carries: torch.Tensor, position: int, coeffs: torch.Tensor,
              outputs: torch.Tensor) -> torch.Tensor | None:
    """The state this chunk started from: ``initial`` for the first chunk, else the one the forward kept."""
    return initial if position == 0 else carries[1].to(_state_dtype(outputs, coeffs, initial))


def _forward_kernel(inputs, coeffs, initial, dim, reverse, log_coeffs, group_name):
    group = _resolve(group_name)
    dim, kernels = _checked(inputs, coeffs, initial, dim, reverse, log_coeffs, group)
    rank, world, position = _position(group, reverse)
    length, state = inputs.shape[dim], initial_shape(inputs, dim, None)
    product = final = incoming = inputs.new_zeros(state, dtype=compute_dtype(inputs.dtype))
    outputs = None
    with torch.no_grad():
        if position < world - 1:  # the later chunks need this one's map
            if length:
                outputs = kernels.forward(inputs, coeffs, dim, reverse, initial if position == 0 else None, None,
                                          log_coeffs)
                final = outputs.select(dim, 0 if reverse else length - 1).to(final.dtype)
            elif position == 0 and initial is not None:
                final = initial.to(final.dtype)
            if position > 0:  # the first chunk's final state already holds everything before it
                product = _coeff_product(inputs, coeffs, dim, log_coeffs)
        maps = _gather(torch.stack([product, final]), group)
        # The maps composed in scan order (a recurrence over the ranks): the state each chunk leaves.
        leaving = kernels.forward(maps[:, 1], maps[:, 0], 0, reverse, None, None, False)
        unsure = _nonfinite_positions(leaving, reverse)[:world - 1] if world > 1 else []
        chained = unsure[0] if unsure else world - 1
        if position > chained:  # the chunks after it start from the state their predecessor's scan leaves
            incoming = _receive(incoming, group, _rank_at(position - 1, world, reverse))
        elif position > 0:  # this chunk starts from the state the chunk before it leaves
            incoming = leaving[rank + 1 if reverse else rank - 1]
        if position > 0:
            outputs = kernels.forward(inputs, coeffs, dim, reverse, incoming.to(_state_dtype(inputs, coeffs, initial)),
                                      None, log_coeffs)
        elif outputs is None:  # the group's only chunk, or an empty first one
            outputs = kernels.forward(inputs, coeffs, dim, reverse, initial, None, log_coeffs)
        if chained <= position < world - 1:
            start = incoming if position > 0 or initial is None else initial.to(incoming.dtype)
            passed = outputs.select(dim, 0 if reverse else length - 1).to(start.dtype) if length else start
            _send(passed, group, _rank_at(position + 1, world, reverse))
    # What the backward needs of this chunk: its product of coefficients and the state it started from.
    return outputs, torch.stack([product, incoming])


def _backward_kernel(d_outputs, coeffs, outputs, initial, carries, dim, reverse, log_coeffs, group_name):
    group = _resolve(group_name)
    rank, world, position = _position(group, reverse)
    kernels = choose("auto", outputs)
    length = outputs.shape[dim]
    with torch.no_grad():
        incoming = _incoming(initial, carries, position, coeffs, outputs)
        arriving = torch.zeros_like(carries[1])
        gradients = None
        if position > 0:  # from no gradient arriving: the chunk's map of the gradient is its d_initial
            gradients = kernels.backward(d_outputs, coeffs, outputs, dim, reverse, incoming, None, log_coeffs)
            if length:
                arriving = gradients[2].to(arriving.dtype)
        maps = _gather(torch.stack([carries[0], arriving]), group)
        # The maps of the gradient composed against the scan's direction, with the conjugated coefficient
        # products: the gradient each chunk passes to the one before it.
        leaving = kernels.forward(maps[:, 1], maps[:, 0].conj(), 0, not reverse, None, None, False)
        unsure = [place for place in _nonfinite_positions(leaving, reverse) if place > 0] if world > 1 else []
        chained = unsure[-1] if unsure else 0
        carry = arriving
        if position < chained:  # the chunks before it take the gradient their successor's backward passes
            carry = _receive(arriving, group, _rank_at(position + 1, world, reverse))
        elif position < world - 1:  # the gradient reaching this chunk's last step from the later chunks
            carry = leaving[rank - 1 if reverse else rank + 1]
        if position < world - 1:
            driving = d_outputs.clone()
            if length:  # added in the carry's dtype, rounded to d_outputs' once
                driving.select(dim, 0 if reverse else length - 1).add_(carry)
            gradients = kernels.backward(driving, coeffs, outputs, dim, reverse, incoming, None, log_coeffs)
            if length == 0 and initial is not None:  # an empty first chunk passes the gradient on to initial
                gradients = (*gradients[:2], carry.to(initial.dtype))
        elif gradients is None:  # the group's only chunk
            gradients = kernels.backward(d_outputs, coeffs, outputs, dim, reverse, incoming, None, log_coeffs)
        if 0 < position <= chained:
            passed = gradients[2].to(carry.dtype) if length else carry
            _send(passed, group, _rank_at(position - 1, world, reverse))
        d_inputs, d_coeffs, d_initial = gradients
    if initial is None:
        return d_inputs, d_coeffs, d_initial
    # initial enters at the first chunk only: the other ranks' part of its gradient is zero.
    return d_inputs, d_coeffs, d_initial if position == 0 else torch.zeros_like(initial)


def _forward_fake(inputs, coeffs, initial, dim, reverse, log_coeffs, group_name):
    dim = check_arguments(_OP, inputs, coeffs, dim, initial, None, log_coeffs)
    carries_shape = (2, *initial_shape(inputs, dim, None))
    return torch.empty_like(inputs), inputs.new_empty(carries_shape, dtype=compute_dtype(inputs.dtype))


def _backward_fake(d_outputs, coeffs, outputs, initial, carries, dim, reverse, log_coeffs, group_name):
    full = coeffs.shape == outputs.shape
    d_coeffs = torch.empty_like(outputs, dtype=coeffs.dtype) if full else coeffs.new_empty(coeffs.shape)
    d_initial = torch.empty_like(initial) if initial is not None else d_outputs.new_zeros((0,))
    return torch.empty_like(outputs), d_coeffs, d_initial


for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("sequence_parallel_forward", _forward_kernel, _key)
    _LIBRARY.impl("sequence_parallel_backward", _backward_kernel, _key)
torch.library.register_fake("linrec::sequence_parallel_forward", _forward_fake)
torch.library.register_fake("linrec::sequence_parallel_backward", _backward_fake)

_FORWARD = torch.ops.linrec.sequence_parallel_forward.default
_BACKWARD = torch.ops.linrec.sequence_parallel_backward.default


# ----- derivatives ----------------------------------------------------------------------------------------

class _SequenceParallel(_SingleLevelFunction):
    """The forward op as (inputs, coeffs, initial, options) -> (outputs, carries), options = (dim, reverse,
    log_coeffs, group_name); carries holds this chunk's product of coefficients and incoming state. Its
    backward and jvp are the ops again, over the whole group."""

    @staticmethod
    def forward(ctx, inputs, coeffs, initial, options):
        with below_this_level():
            outputs, carries = _FORWARD(inputs, coeffs, initial, *options)
        ctx.save_for_backward(coeffs, outputs, initial, carries)
        save_for_forward(ctx, coeffs, outputs, initial, carries)
        ctx.options = (options[0] % inputs.dim(), *options[1:])
        ctx.mark_non_differentiable(carries)
        return outputs, carries

    @staticmethod
    def backward(ctx, d_outputs, _d_carries):
        coeffs, outputs, initial, carries = ctx.saved_tensors
        d_inputs, d_coeffs, d_initial = _BACKWARD(d_outputs, coeffs, outputs, initial, carries, *ctx.options)
        return d_inputs, d_coeffs, d_initial if initial is not None else None, None

    @staticmethod
    def jvp(ctx, t_inputs, t_coeffs, t_initial, _options):
        # The tangent is the recurrence over the whole sequence driven by x' + c' * prev(y), from h'.
        check_single_forward_mode_level()
        coeffs, outputs, initial, carries = ctx.saved_tensors
        dim, reverse, log_coeffs, group_name = ctx.options

        def previous():
            incoming = _incoming(initial, carries, _position(_resolve(group_name), reverse)[2], coeffs, outputs)
            return previous_step(outputs, incoming, dim, reverse, None)

        driving = forward_tangent_operand(t_inputs, t_coeffs, coeffs, log_coeffs, previous, outputs)
        tangent, _ = _FORWARD(driving, coeffs, t_initial, dim, reverse, log_coeffs, group_name)
        return tangent, None


class _SequenceParallelBackward(_SingleLevelFunction):
    """The backward op, differentiable once: its own derivatives raise when they are asked for."""

    @staticmethod
    def forward(ctx, d_outputs, coeffs, outputs, initial, carries, options):
        with below_this_level():
            return _BACKWARD(d_outputs, coeffs, outputs, initial, carries, *options)

    @staticmethod
    def backward(ctx, *_cotangents):
        raise NotImplementedError(f"{_OP}: second derivatives (double backward, hessian) are not supported")

    @staticmethod
    def jvp(ctx, *_tangents):
        raise NotImplementedError(f"{_OP}: second derivatives (forward-mode AD of the backward) are not supported")


def _forward_autograd(keyset, inputs, coeffs, initial, dim, reverse, log_coeffs, group_name):
    options = (dim, reverse, log_coeffs, group_name)
    return autograd_kernel(keyset, _SequenceParallel, (inputs, coeffs, initial, options), (inputs, coeffs, initial),
                           _FORWARD, (inputs, coeffs, initial, *options))


def _backward_autograd(keyset, d_outputs, coeffs, outputs, initial, carries, dim, reverse, log_coeffs, group_name):
    options = (dim, reverse, log_coeffs, group_name)
    return autograd_kernel(keyset, _SequenceParallelBackward, (d_outputs, coeffs, outputs, initial, carries, options),
                           (d_outputs, coeffs, outputs, initial), _BACKWARD,
                           (d_outputs, coeffs, outputs, initial, carries, *options))


_LIBRARY.impl("sequence_parallel_forward", _forward_autograd, "Autograd", with_keyset=True)
_LIBRARY.impl("sequence_parallel_backward", _backward_autograd, "Autograd", with_keyset=True)
