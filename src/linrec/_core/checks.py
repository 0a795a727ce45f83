"""Argument checks, and the one error convention of linrec's public API.

The error convention
--------------------
Every public entry point (``linrec.linrec``, ``linrec.last_states``, the layers of ``linrec.nn``,
``linrec.rl``, ``linrec.selective_scan``, ``linrec.distributed.linrec``) raises, for a bad argument:

- ``TypeError`` for an argument of the wrong Python type or dtype;
- ``IndexError`` for a ``dim`` out of range;
- ``ValueError`` for a wrong value or shape (a tensor on another device included).

The message starts with the public name of what raised it, which starts with ``linrec``: ``linrec:`` for
``linrec.linrec`` (the package's namesake, and what any layer above it lets through), ``linrec.last_states:``,
``linrec.nn.MinGRU:``, ``linrec.rl.gae:``, ``linrec.selective_scan:``, ``linrec.distributed.linrec:``.
It then names the argument, what was expected and what was given, with dtypes in torch's names
(``torch.float32``) and Python types by name (``numpy.float64``, ``list``); the Python checks of the
arguments the C++ ops check too repeat the ops' text verbatim.

Scalar arguments are taken as torch takes them: ``dim`` as any integer (a Python int, a numpy integer, a
0-dim integer tensor; not a bool), the flags (``reverse``, ``log_coeffs``, ...) as a Python bool or a
``numpy.bool_`` (not 0 or 1), and ``coeffs`` also as a Python number, a 0-dim decay shared by every step.

Other exceptions are not argument errors: ``RuntimeError`` for what this machine or build cannot run (no
CUDA kernels, triton not installed, an NVIDIA driver too old, torch.distributed not initialized), and
``NotImplementedError`` for derivatives that are not supported.

The ops called directly
-----------------------
``torch.ops.linrec.forward`` and ``torch.ops.linrec.backward`` (and the fused scan's
``selective_scan_forward`` and ``selective_scan_backward``) check their arguments in C++
(csrc/include/linrec/ops.h, ssm/ops.h). torch turns every C++ exception of an op into one Python type,
which libraries on the LibTorch stable ABI cannot choose: ``ValueError`` up to torch 2.13, ``RuntimeError``
with torch 2.15 (2.14 untried). The message starts with the op's name (``linrec.forward:``,
``linrec.backward:``, ``linrec.selective_scan_forward:``, ``linrec.selective_scan_backward:``) and, where the convention's
type is not ``ValueError``, ends with `` [TypeError]`` or `` [IndexError]``; ``linrec.linrec`` re-raises it
under its own name as that type (``api_error``). A bad ``LINREC_CPU_ISA`` (the environment variable that
pins the CPU kernels' instruction set) is refused the same way, its message starting with
``linrec: LINREC_CPU_ISA``; ``linrec.linrec`` re-raises it as a ``ValueError``. The fake kernels
(meta tensors, torch.compile's tracing) and the Triton ops run the Python checks below: the convention's
types, with the C++ ops' messages, where the refusal of a packed layout goes on to say how to pack
(``PACKING_HINT``, which ``api_error`` adds to the C++ op's message); tests/test_errors.py holds the two to
the same text.

The checks
----------
The C++ ops own the checks of every call that reaches them; ``linrec.linrec`` does not check again (it
only turns argument types the ops' schemas would misread into the ones they take). The checks here serve
what has no C++ op beneath it: the fake kernels, the Triton ops, the references, ``linrec.distributed``,
and the layers, whose own checks are built from the helpers below.
"""

from __future__ import annotations

import numbers
import operator
import re
import weakref
from collections.abc import Sequence

import torch

REAL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SUPPORTED_DTYPES = (*REAL_DTYPES, torch.complex64, torch.complex128)
#: The dtypes of indices into a cache of state rows (the decode steps' batch rows).
INDEX_DTYPES = (torch.int32, torch.int64)
#: The input dtypes whose coeffs and initial may also be float32.
HALF_DTYPES = (torch.float16, torch.bfloat16)
# The C++ ops' words for SUPPORTED_DTYPES (csrc/include/linrec/ops.h), which the fake kernels repeat.
_DTYPE_NAMES = "torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64 or torch.complex128"
#: How packed sequences are laid out, said with the refusal of any other layout. The C++ op's message stops
#: before it (``api_error`` adds it there).
PACKING_HINT = ("packed sequences need a batch dim of size 1 before the time dim: a tensor x of shape "
                "(total, channels) packed along dim 0 goes in as x.unsqueeze(0) with dim=1")
_PACKING_REFUSAL = "must have a batch dim (dim 0) of size 1 before it"


# ----- the pieces of every check ----------------------------------------------------------------------
# Plain ``if ...: raise``: torch.compile traces the layers' checks, and refuses torch._check*'s messages
# when they read a tensor.


def type_name(value: object) -> str:
    """The name a message gives value's type: ``list``, ``numpy.float64``, ``torch.Tensor``; ``None`` for None."""
    if value is None:
        return "None"
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    """``torch.float32, torch.float64 or torch.bfloat16``."""
    names = [str(dtype) for dtype in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _is_numpy_bool(value: object) -> bool:
    # numpy.bool_ (whose class is named numpy.bool from numpy 2 on), told without importing numpy, which
    # linrec does not depend on.
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def as_bool(op: str, name: str, value: object) -> bool:
    """A flag as torch's functions take one: a Python bool or a numpy.bool_. Not 0 or 1, which an op's schema
    would read as a bool without a word."""
    if type(value) is bool:
        return value
    if _is_numpy_bool(value):
        return bool(value)
    raise TypeError(f"{op}: {name} must be a bool, got {type_name(value)}")


def as_int(op: str, name: str, value: object) -> int:
    """An integer as torch's functions take one: anything with ``__index__`` (a Python int, a numpy integer, a
    0-dim integer tensor), but not a bool."""
    if type(value) is int:
        return value
    if not isinstance(value, bool) and not _is_numpy_bool(value):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{op}: {name} must be an int, got {type_name(value)}")


def as_positive_int(op: str, name: str, value: object) -> int:
    """A size (channels, ...): an int (as ``as_int`` takes it) above 0."""
    number = as_int(op, name, value)
    if number <= 0:
        raise ValueError(f"{op}: {name} must be a positive int, got {number}")
    return number


def normalize_dim(op: str, dim: object, ndim: int) -> int:
    """Maps dim (an int as ``as_int`` takes it) in [-ndim, ndim) to [0, ndim); raises IndexError otherwise."""
    dim = as_int(op, "dim", dim)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim must be in [{-ndim}, {ndim - 1}] for a {ndim}-dim tensor, got {dim}")
    return dim % ndim


def check_tensor(op: str, name: str, value: object, *, or_none: bool = False) -> None:
    """value must be a tensor, or None where ``or_none`` (the message then says so)."""
    if isinstance(value, torch.Tensor) or (or_none and value is None):
        return
    raise TypeError(f"{op}: {name} must be a torch.Tensor{' or None' if or_none else ''}, got {type_name(value)}")


def check_dtype(op: str, name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype],
                expected: str | None = None) -> None:
    """tensor's dtype must be one of ``allowed``, which ``expected`` words where torch's names of them would not."""
    if tensor.dtype not in allowed:
        raise TypeError(f"{op}: {name} must be {expected or dtype_names(allowed)}, got {tensor.dtype}")


def check_device(op: str, name: str, tensor: torch.Tensor, where: str, device: torch.device) -> None:
    """tensor must be on ``device``, the device of what ``where`` names (``inputs``, ``the layer's parameters``)."""
    if tensor.device != device:
        raise ValueError(f"{op}: {name} must be on the device of {where} ({device}), got {tensor.device}")


def is_broadcastable(shape: Sequence[int], to: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``to`` (torch's rules, trailing dims first) without changing it."""
    return len(shape) <= len(to) and all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(to)))


# ----- the recurrence's arguments ---------------------------------------------------------------------


def _check_coeff_like(op: str, name: str, tensor: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """coeffs and initial: on the device of `like` (inputs), of its dtype or, where it is 16-bit, float32
    (mixed precision: the kernels then read both in float32)."""
    check_device(op, name, tensor, like_name, like.device)
    mixed = like.dtype in HALF_DTYPES
    allowed = f"({like.dtype}) or torch.float32" if mixed else f"({like.dtype})"
    if not (tensor.dtype == like.dtype or (mixed and tensor.dtype == torch.float32)):
        raise TypeError(f"{op}: {name} must have the dtype of {like_name} {allowed}, got {tensor.dtype}")


def as_coeffs(op: str, coeffs: object, inputs: torch.Tensor) -> torch.Tensor:
    """coeffs as the ops take them: a tensor as it is; a Python number (or numpy scalar) as a 0-dim tensor
    on the device of ``inputs``, of their dtype or, for 16-bit inputs, float32 (mixed precision: bfloat16
    stores a decay of 0.999 as 1.0). A complex number needs complex inputs."""
    if isinstance(coeffs, torch.Tensor):
        return coeffs
    if not isinstance(coeffs, numbers.Number) or isinstance(coeffs, bool):
        raise TypeError(f"{op}: coeffs must be a torch.Tensor or a number, got {type_name(coeffs)}")
    if not isinstance(coeffs, numbers.Real) and not inputs.is_complex():
        raise TypeError(f"{op}: coeffs must be a real number for inputs of {inputs.dtype} (a complex one needs "
                        f"complex inputs), got {coeffs}")
    dtype = torch.float32 if inputs.dtype in HALF_DTYPES else inputs.dtype
    return torch.full((), coeffs, dtype=dtype, device=inputs.device)


def typed_arguments(op: str, inputs: object, coeffs: object, dim: object, reverse: object, initial: object,
                    cu_seqlens: object, log_coeffs: object) -> tuple[torch.Tensor, int, bool, bool]:
    """The public arguments in the Python types the ops' schemas take: ``(coeffs, dim, reverse, log_coeffs)``
    converted as ``as_coeffs``, ``as_int`` and ``as_bool`` take them. Raises TypeError for any other type, which
    a schema would refuse in its own words (or, for a flag, misread)."""
    check_tensor(op, "inputs", inputs)
    coeffs = as_coeffs(op, coeffs, inputs)
    dim = as_int(op, "dim", dim)
    reverse = as_bool(op, "reverse", reverse)
    for name, value in (("initial", initial), ("cu_seqlens", cu_seqlens)):
        if value is not None:
            check_tensor(op, name, value)
    return coeffs, dim, reverse, as_bool(op, "log_coeffs", log_coeffs)


def initial_shape(inputs: torch.Tensor, dim: int, cu_seqlens: torch.Tensor | None) -> list[int]:
    """The shape ``initial`` must have: inputs' without the time dim; with cu_seqlens, dim 0 (the batch dim of
    size 1) counts the packed sequences."""
    shape = [size for d, size in enumerate(inputs.shape) if d != dim]
    if cu_seqlens is not None:
        shape[0] = cu_seqlens.shape[0] - 1
    return shape


def check_offsets(op: str, cu_seqlens: object, values_name: str, values: torch.Tensor) -> None:
    """cu_seqlens as a tensor: 1-dim, at least 2 offsets, int32 or int64, on the device of ``values``."""
    check_tensor(op, "cu_seqlens", cu_seqlens)
    if not (cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2):
        raise ValueError(f"{op}: cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape "
                         f"{list(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: cu_seqlens must be torch.int32 or torch.int64, got {cu_seqlens.dtype}")
    check_device(op, "cu_seqlens", cu_seqlens, values_name, values.device)


def packed_sequences(op: str, cu_seqlens: torch.Tensor | None, values_name: str, values: torch.Tensor) -> int:
    """The number of sequences of a (batch, channels, length) ``values`` argument: its batch, or with ``cu_seqlens``
    the sequences packed along its length, which needs a batch of 1 (offsets checked; their values in eager mode,
    where they have any)."""
    if cu_seqlens is None:
        return values.shape[0]
    check_offsets(op, cu_seqlens, values_name, values)
    if values.shape[0] != 1:
        raise ValueError(f"{op}: with cu_seqlens, {values_name} must hold its sequences packed along its length with "
                         f"a batch of 1, got shape {list(values.shape)}")
    if not torch.compiler.is_compiling() and cu_seqlens.device.type != "meta":  # meta offsets hold no values
        check_cu_seqlens_values(op, cu_seqlens, values.shape[-1])
    return cu_seqlens.shape[0] - 1


def check_cache_row_values(op: str, name: str, indices: torch.Tensor, cache_name: str, slots: int) -> None:
    """The values of ``indices`` (batch,), the rows of the cache ``cache_name`` that the batch rows update: below
    its ``slots`` rows and distinct where not negative (negative: a padded batch row). One read of the values on
    the host, so not made under torch.compile or CUDA graph capture, where the ops take an index past the rows as
    a padded row's."""
    if (torch.compiler.is_compiling() or indices.numel() == 0
            or (indices.is_cuda and torch.cuda.is_current_stream_capturing())):
        return
    kept = indices[indices >= 0]
    largest = int(kept.max()) if kept.numel() else -1
    if largest >= slots:
        raise ValueError(f"{op}: {name} must be below {cache_name}'s {slots} rows (or negative for a padded row), "
                         f"got {largest}")
    if kept.unique().numel() != kept.numel():
        raise ValueError(f"{op}: {name} must be distinct (each {cache_name} row is updated by one batch row), got "
                         f"{indices.tolist()}")


def check_packed_layout(op: str, values_name: str, values: torch.Tensor, dim: int) -> None:
    """Packed sequences lie along ``dim`` (normalized) behind a batch dim 0 of size 1."""
    if not (dim != 0 and values.shape[0] == 1):
        raise ValueError(f"{op}: with cu_seqlens, {values_name} packs its sequences along dim {dim} and "
                         f"{_PACKING_REFUSAL}, got shape {list(values.shape)}; {PACKING_HINT}")


def check_initial(op: str, initial: object, values_name: str, values: torch.Tensor, dim: int,
                  cu_seqlens: torch.Tensor | None) -> None:
    """initial as the recurrence takes it: like ``values`` (``_check_coeff_like``), of ``initial_shape``."""
    check_tensor(op, "initial", initial)
    _check_coeff_like(op, "initial", initial, values_name, values)
    expected = initial_shape(values, dim, cu_seqlens)
    what = "without the time dim" + (", dim 0 counting the cu_seqlens sequences" if cu_seqlens is not None else "")
    if list(initial.shape) != expected:
        raise ValueError(f"{op}: initial must have shape {expected} (the shape of {values_name} {what}), "
                         f"got {list(initial.shape)}")


def check_arguments(
    op: str,
    inputs: torch.Tensor,
    coeffs: torch.Tensor,
    dim: int,
    initial: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    log_coeffs: bool,
    inputs_name: str = "inputs",
) -> int:
    """Checks the arguments of a recurrence together, in the C++ ops' order and words; returns dim normalized
    to [0, inputs.dim()). Raises TypeError or ValueError (IndexError for dim) naming the argument, what was
    expected and what was given."""
    check_tensor(op, inputs_name, inputs)
    check_tensor(op, "coeffs", coeffs)
    torch._check_value(inputs.dim() >= 1,
                       lambda: f"{op}: {inputs_name} must have at least one dim (the time dim), got a 0-dim tensor")
    check_dtype(op, inputs_name, inputs, SUPPORTED_DTYPES, _DTYPE_NAMES)
    dim = normalize_dim(op, dim, inputs.dim())
    as_bool(op, "log_coeffs", log_coeffs)
    _check_coeff_like(op, "coeffs", coeffs, inputs_name, inputs)
    torch._check_value(is_broadcastable(coeffs.shape, inputs.shape), lambda: (
        f"{op}: coeffs must be broadcastable to the shape of {inputs_name} {list(inputs.shape)}, "
        f"got {list(coeffs.shape)}"))
    torch._check_value(not (log_coeffs and inputs.is_complex()), lambda: (
        f"{op}: log_coeffs=True takes real coefficients (the log of a complex coefficient is ambiguous), "
        f"got {coeffs.dtype}"))
    if cu_seqlens is not None:
        check_offsets(op, cu_seqlens, inputs_name, inputs)
        # The kernels read the offsets as a plain array.
        torch._check_value(cu_seqlens.is_contiguous(),
                           lambda: f"{op}: cu_seqlens must be contiguous, got stride {cu_seqlens.stride(0)}")
        check_packed_layout(op, inputs_name, inputs, dim)
    if initial is not None:
        check_initial(op, initial, inputs_name, inputs, dim, cu_seqlens)
    return dim


def check_backward_arguments(op: str, d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, dim: int,
                             initial: torch.Tensor | None, cu_seqlens: torch.Tensor | None, log_coeffs: bool) -> int:
    """The backward op's arguments: the forward's, with d_outputs for inputs, and outputs like d_outputs."""
    dim = check_arguments(op, d_outputs, coeffs, dim, initial, cu_seqlens, log_coeffs, "d_outputs")
    check_tensor(op, "outputs", outputs)
    check_device(op, "outputs", outputs, "d_outputs", d_outputs.device)
    torch._check_type(outputs.dtype == d_outputs.dtype, lambda: (
        f"{op}: outputs must have the dtype of d_outputs ({d_outputs.dtype}), got {outputs.dtype}"))
    torch._check_value(outputs.shape == d_outputs.shape, lambda: (
        f"{op}: outputs must have shape {list(d_outputs.shape)} (the shape of d_outputs), got {list(outputs.shape)}"))
    return dim


# ----- the C++ ops' errors, as the API raises them -------------------------------------------------------

# An op's message starts with the op's name; a C++ op's ends with the Python exception its check stands for
# (csrc/include/linrec/check.h).
_OP_NAME = re.compile(r"linrec\.(?:triton_)?forward: ")
_KIND = re.compile(r" \[(TypeError|IndexError)\]")
# The CPU kernels' refusal of a bad LINREC_CPU_ISA (csrc/include/linrec/cpu/isa.h), which names no op (only linrec).
_CPU_ISA = re.compile(r"LINREC_CPU_ISA\b.*", re.DOTALL)


def api_error(op: str, error: Exception) -> Exception | None:
    """The exception ``op`` raises for an argument error its forward op raised: the op's message under
    ``op``'s name, as the type the check stands for, a refused layout of packed sequences with
    ``PACKING_HINT``; a bad LINREC_CPU_ISA as a ValueError under ``op``'s name; None for any other error (a
    CUDA error, a device the build lacks), which the API lets through as it is."""
    if not isinstance(error, (TypeError, ValueError, IndexError, RuntimeError)):
        return None
    message = str(error)
    named = _OP_NAME.search(message)
    if named is None:
        isa = _CPU_ISA.search(message)
        return None if isa is None else ValueError(f"{op}: {isa.group().strip()}")
    text = message[named.end():]
    marked = _KIND.search(text)
    if marked is not None:
        return (TypeError if marked.group(1) == "TypeError" else IndexError)(f"{op}: {text[:marked.start()]}")
    text = text.strip()
    if _PACKING_REFUSAL in text and PACKING_HINT not in text:
        text = f"{text}; {PACKING_HINT}"
    kind = type(error) if isinstance(error, (TypeError, IndexError)) else ValueError
    return kind(f"{op}: {text}")


# ----- the offsets' values ------------------------------------------------------------------------------


def check_cu_seqlens_not_vmapped(op: str, vmapped: bool) -> None:
    """One call scans one packing of the sequences: torch.vmap cannot batch the offsets."""
    if vmapped:
        raise ValueError(
            f"{op}: torch.vmap over cu_seqlens is not supported (one call scans one packing of the sequences); "
            "vmap over inputs, coeffs and initial with the same cu_seqlens instead"
        )


# Offsets found valid, by tensor identity: a weak reference, the tensor's version counter and the length
# they were checked against. The layers of a model scan the same offsets, which are checked (and waited
# for) once. Keyed by id (tensors compare elementwise), each entry removed when its tensor goes.
_VALID_OFFSETS: dict[int, tuple[weakref.ref, int, int]] = {}


def _forget_offsets(key: int) -> None:
    _VALID_OFFSETS.pop(key, None)


def check_cu_seqlens_values(op: str, cu_seqlens: torch.Tensor, length: int) -> None:
    """Checks the offsets themselves: 0 first, non-decreasing, the time length last. Reads one flag on the
    host (a synchronization with the GPU), so the API does it in eager mode only, and once per tensor
    until it is modified in place; the offsets themselves are read only to word the error."""
    check_cu_seqlens_not_vmapped(op, torch._C._functorch.is_batchedtensor(cu_seqlens))
    key = id(cu_seqlens)
    entry = _VALID_OFFSETS.get(key)
    if entry is not None and entry[0]() is cu_seqlens and entry[1:] == (cu_seqlens._version, length):
        return
    valid = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == length) & (cu_seqlens[1:] >= cu_seqlens[:-1]).all()
    if valid.item():
        reference = weakref.ref(cu_seqlens, lambda _, key=key: _forget_offsets(key))
        _VALID_OFFSETS[key] = (reference, cu_seqlens._version, length)
        return
    values = cu_seqlens.tolist()
    if values[0] != 0:
        raise ValueError(f"{op}: cu_seqlens must start at 0, got {values[0]}")
    for index, (previous, value) in enumerate(zip(values, values[1:]), start=1):
        if value < previous:
            raise ValueError(f"{op}: cu_seqlens must be non-decreasing, got {previous} then {value} at index {index}")
    if values[-1] != length:
        raise ValueError(f"{op}: cu_seqlens must end at the length of the time dim ({length}), got {values[-1]}")


def check_device_offsets(op: str, cu_seqlens: torch.Tensor, inputs: torch.Tensor, dim: int) -> None:
    """The values of offsets on a GPU, where the op's own checks cannot read them (``check_cu_seqlens_values``);
    offsets or a dim the op refuses anyway are left to its message."""
    if (not isinstance(dim, int) or not -inputs.dim() <= dim < inputs.dim() or cu_seqlens.dim() != 1
            or cu_seqlens.shape[0] < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64)):
        return
    check_cu_seqlens_values(op, cu_seqlens, inputs.shape[dim])

