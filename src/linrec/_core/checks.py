"""Argument checks of the Python ops and the fake kernels, and the public API's view of an op's error.

The C++ ops check their own arguments (csrc/include/linrec/ops.h) and own the checks of every call
that reaches them; ``linrec.linrec`` does not check again. The checks here serve what has no C++ op
beneath it: the fake kernels (tracing, meta tensors), the Triton ops, the references and
``linrec.distributed``. They raise with ``torch._check_*`` the messages and exception types of the C++
checks (tests/test_errors.py holds the two to the same text).
"""

from __future__ import annotations

import re
import weakref

import torch

REAL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SUPPORTED_DTYPES = (*REAL_DTYPES, torch.complex64, torch.complex128)
#: The input dtypes whose coeffs and initial may also be float32.
HALF_DTYPES = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = "float32, float64, float16, bfloat16, complex64 or complex128"


def _check_tensor(op: str, name: str, tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")


def _check_coeff_like(op: str, name: str, tensor: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """coeffs and initial: on the device of `like` (inputs), of its dtype or, where it is 16-bit, float32
    (mixed precision: the kernels then read both in float32)."""
    torch._check_value(tensor.device == like.device,
                       lambda: f"{op}: {name} must be on the device of {like_name} ({like.device}), got {tensor.device}")
    mixed = like.dtype in HALF_DTYPES
    allowed = f"({like.dtype}) or float32" if mixed else f"({like.dtype})"
    torch._check_type(tensor.dtype == like.dtype or (mixed and tensor.dtype == torch.float32),
                      lambda: f"{op}: {name} must have the dtype of {like_name} {allowed}, got {tensor.dtype}")


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Maps dim in [-ndim, ndim) to [0, ndim); raises IndexError otherwise."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    torch._check_index(-ndim <= dim < ndim,
                       lambda: f"{op}: dim must be in [{-ndim}, {ndim - 1}] for a {ndim}-dim tensor, got {dim}")
    return dim % ndim


def check_bool(op: str, name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")


def initial_shape(inputs: torch.Tensor, dim: int, cu_seqlens: torch.Tensor | None) -> list[int]:
    """The shape ``initial`` must have: inputs' without the time dim; with cu_seqlens, dim 0 (the batch dim of
    size 1) counts the packed sequences."""
    shape = [size for d, size in enumerate(inputs.shape) if d != dim]
    if cu_seqlens is not None:
        shape[0] = cu_seqlens.shape[0] - 1
    return shape


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
    """Checks the arguments of a recurrence together; returns dim normalized to [0, inputs.dim()).
    Raises TypeError or ValueError (IndexError for dim) naming the argument, what was expected and what was given."""
    _check_tensor(op, inputs_name, inputs)
    _check_tensor(op, "coeffs", coeffs)
    torch._check_value(inputs.dim() >= 1,
                       lambda: f"{op}: {inputs_name} must have at least one dim (the time dim), got a 0-dim tensor")
    torch._check_type(inputs.dtype in SUPPORTED_DTYPES, lambda: f"{op}: {inputs_name} must be {_DTYPE_NAMES}, got {inputs.dtype}")
    dim = normalize_dim(op, dim, inputs.dim())
    check_bool(op, "log_coeffs", log_coeffs)
    _check_coeff_like(op, "coeffs", coeffs, inputs_name, inputs)
    broadcastable = coeffs.dim() <= inputs.dim() and all(
        c == 1 or c == x for c, x in zip(reversed(coeffs.shape), reversed(inputs.shape)))
    torch._check_value(broadcastable, lambda: f"{op}: coeffs must be broadcastable to the shape of {inputs_name} "
                                              f"{list(inputs.shape)}, got {list(coeffs.shape)}")
    torch._check_value(not (log_coeffs and inputs.is_complex()), lambda: (
        f"{op}: log_coeffs=True takes real coefficients (the log of a complex coefficient is ambiguous), "
        f"got {coeffs.dtype}"))
    if cu_seqlens is not None:
        _check_tensor(op, "cu_seqlens", cu_seqlens)
        torch._check_value(cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2, lambda: (
            f"{op}: cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape {list(cu_seqlens.shape)}"))
        torch._check_type(cu_seqlens.dtype in (torch.int32, torch.int64),
                          lambda: f"{op}: cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
        torch._check_value(cu_seqlens.device == inputs.device, lambda: (
            f"{op}: cu_seqlens must be on the device of {inputs_name} ({inputs.device}), got {cu_seqlens.device}"))
        # The kernels read the offsets as a plain array.
        torch._check_value(cu_seqlens.is_contiguous(),
                           lambda: f"{op}: cu_seqlens must be contiguous, got stride {cu_seqlens.stride(0)}")
        torch._check_value(dim != 0 and inputs.shape[0] == 1, lambda: (
            f"{op}: with cu_seqlens, {inputs_name} packs its sequences along dim {dim} and must have a batch dim "
            f"(dim 0) of size 1 before it, got shape {list(inputs.shape)}"))
    if initial is not None:
        _check_tensor(op, "initial", initial)
        _check_coeff_like(op, "initial", initial, inputs_name, inputs)
        expected = initial_shape(inputs, dim, cu_seqlens)
        what = "without the time dim" + (", dim 0 counting the cu_seqlens sequences" if cu_seqlens is not None else "")
        torch._check_value(list(initial.shape) == expected, lambda: (
            f"{op}: initial must have shape {expected} (the shape of {inputs_name} {what}), got {list(initial.shape)}"))
    return dim


def check_backward_arguments(op: str, d_outputs: torch.Tensor, coeffs: torch.Tensor, outputs: torch.Tensor, dim: int,
                             initial: torch.Tensor | None, cu_seqlens: torch.Tensor | None, log_coeffs: bool) -> int:
    """The backward op's arguments: the forward's, with d_outputs for inputs, and outputs like d_outputs."""
    dim = check_arguments(op, d_outputs, coeffs, dim, initial, cu_seqlens, log_coeffs, "d_outputs")
    _check_tensor(op, "outputs", outputs)
    torch._check_value(outputs.device == d_outputs.device, lambda: (
        f"{op}: outputs must be on the device of d_outputs ({d_outputs.device}), got {outputs.device}"))
    torch._check_type(outputs.dtype == d_outputs.dtype, lambda: (
        f"{op}: outputs must have the dtype of d_outputs ({d_outputs.dtype}), got {outputs.dtype}"))
    torch._check_value(outputs.shape == d_outputs.shape, lambda: (
        f"{op}: outputs must have shape {list(d_outputs.shape)} (the shape of d_outputs), got {list(outputs.shape)}"))
    return dim


def check_argument_types(op: str, inputs: object, coeffs: object, dim: object, reverse: object, initial: object,
                         cu_seqlens: object, log_coeffs: object) -> None:
    """The Python types of the public arguments, which an op's schema refuses before its own checks run."""
    _check_tensor(op, "inputs", inputs)
    _check_tensor(op, "coeffs", coeffs)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    check_bool(op, "reverse", reverse)
    for name, value in (("initial", initial), ("cu_seqlens", cu_seqlens)):
        if value is not None:
            _check_tensor(op, name, value)
    check_bool(op, "log_coeffs", log_coeffs)


# An op's message starts with the op's name; a C++ op's ends with the Python exception its check stands for
# (csrc/include/linrec/check.h).
_OP_NAME = re.compile(r"linrec\.(?:triton_)?forward: ")
_KIND = re.compile(r" \[(TypeError|IndexError)\]")


def api_error(op: str, error: Exception) -> Exception | None:
    """The exception ``op`` raises for an argument error its forward op raised: the op's message under
    ``op``'s name, as the type the check stands for; None for any other error (a CUDA error, a device the
    build lacks), which the API lets through as it is."""
    if not isinstance(error, (TypeError, ValueError, IndexError, RuntimeError)):
        return None
    message = str(error)
    named = _OP_NAME.search(message)
    if named is None:
        return None
    text = message[named.end():]
    marked = _KIND.search(text)
    if marked is not None:
        return (TypeError if marked.group(1) == "TypeError" else IndexError)(f"{op}: {text[:marked.start()]}")
    kind = type(error) if isinstance(error, (TypeError, IndexError)) else ValueError
    return kind(f"{op}: {text.strip()}")


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

