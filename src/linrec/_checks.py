"""Argument checks shared by the public API and the fake (tracing) kernels of the ops."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_DTYPE_NAMES = "float32, float64, float16 or bfloat16"


def check_operands(op: str, **operands: torch.Tensor) -> None:
    """Checks that every operand is a tensor of a supported dtype with the first one's shape, device
    and dtype; raises TypeError or ValueError naming the argument, what was expected and what was given."""
    for name, tensor in operands.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    (first_name, first), *others = operands.items()
    if first.dim() < 1:
        raise ValueError(f"{op}: {first_name} must have at least one dim (the time dim), got a 0-dim tensor")
    if first.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: {first_name} must be {_DTYPE_NAMES}, got {first.dtype}")
    for name, tensor in others:
        if tensor.shape != first.shape:
            raise ValueError(
                f"{op}: {name} must have the shape of {first_name} {list(first.shape)}, got {list(tensor.shape)}"
            )
        if tensor.device != first.device:
            raise ValueError(f"{op}: {name} must be on the device of {first_name} ({first.device}), got {tensor.device}")
        if tensor.dtype != first.dtype:
            raise TypeError(f"{op}: {name} must have the dtype of {first_name} ({first.dtype}), got {tensor.dtype}")


def normalize_dim(op: str, dim: int, ndim: int) -> int:
    """Maps dim in [-ndim, ndim) to [0, ndim); raises IndexError otherwise."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim must be in [{-ndim}, {ndim - 1}] for a {ndim}-dim tensor, got {dim}")
    return dim % ndim


def check_bool(op: str, name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
