"""linrec: the linear recurrence ``y[l] = c[l] * y[l-1] + x[l]`` as a fast, differentiable PyTorch op.

>>> import torch, linrec
>>> x, c = torch.randn(4, 1024), torch.rand(4, 1024)
>>> y = linrec.linrec(x, c)                      # scans the last dim
>>> y_rev = linrec.linrec(x, c, reverse=True)    # from the last element to the first
"""

from __future__ import annotations

import torch

from . import _ops
from ._checks import check_bool, check_operands, normalize_dim
from ._ops import HAS_CUDA_KERNELS
from ._version import __version__
from .reference import REFERENCES, linrec_heinsen, linrec_hop, linrec_loop

#: Every value ``backend`` accepts: the compiled kernels ("auto") and the pure-PyTorch references.
BACKENDS = ("auto", *REFERENCES)

__all__ = [
    "BACKENDS",
    "HAS_CUDA_KERNELS",
    "REFERENCES",
    "__version__",
    "linrec",
    "linrec_heinsen",
    "linrec_hop",
    "linrec_loop",
]

_KERNEL_DEVICES = ("cpu", "cuda", "meta")


def _kernel(inputs: torch.Tensor, coeffs: torch.Tensor, reverse: bool) -> torch.Tensor:
    if inputs.device.type not in _KERNEL_DEVICES:
        raise ValueError(
            f"linrec: the compiled kernels run on cpu and cuda tensors, got {inputs.device}; "
            "backend='hop' runs on any device torch supports"
        )
    if inputs.is_cuda and not HAS_CUDA_KERNELS:
        raise RuntimeError(
            "linrec: this build has no CUDA kernels (it was built without nvcc, with LINREC_NO_CUDA, or torch "
            "has no CUDA); reinstall linrec with CUDA, or pass backend='hop'"
        )
    return torch.ops.linrec.forward(inputs, coeffs, reverse)


def linrec(
    inputs: torch.Tensor,
    coeffs: torch.Tensor,
    dim: int = -1,
    reverse: bool = False,
    backend: str = "auto",
) -> torch.Tensor:
    """Computes the linear recurrence ``outputs[l] = coeffs[l] * outputs[l-1] + inputs[l]`` along ``dim``.

    The recurrence starts at ``outputs[0] = inputs[0]``, so ``coeffs[0]`` takes no part (its gradient
    is zero). Differentiable in ``inputs`` and ``coeffs``, and traceable by ``torch.compile``
    (``fullgraph=True``, dynamic shapes too).

    Args:
        inputs: the additive terms x, any shape, float32, float64, float16 or bfloat16
            (16-bit types accumulate in float32).
        coeffs: the multiplicative coefficients c, same shape, device and dtype as ``inputs``.
        dim: the time dim along which the recurrence runs.
        reverse: run from the last element to the first (``outputs[l] = coeffs[l] * outputs[l+1] + inputs[l]``).
        backend: ``"auto"`` for the compiled CPU/CUDA kernels, or a reference implementation by name:
            ``"loop"``, ``"hop"`` (torch's associative_scan) or ``"heinsen"`` (log space).

    Returns:
        outputs, with the shape, dtype and device of ``inputs``.

    Example:
        >>> x, c = torch.randn(2, 8, 100), torch.rand(2, 8, 100)
        >>> y = linrec(x, c, dim=-1)
        >>> torch.allclose(y[..., 1], c[..., 1] * x[..., 0] + x[..., 1])
        True
    """
    check_operands("linrec", inputs=inputs, coeffs=coeffs)
    dim = normalize_dim("linrec", dim, inputs.dim())
    check_bool("linrec", "reverse", reverse)
    if backend == "auto":
        recurrence = _kernel
    elif backend in REFERENCES:
        recurrence = REFERENCES[backend]
    else:
        raise ValueError(f"linrec: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")

    last = inputs.dim() - 1
    if dim == last:
        return recurrence(inputs, coeffs, reverse)
    outputs = recurrence(inputs.movedim(dim, last), coeffs.movedim(dim, last), reverse)
    return outputs.movedim(last, dim)
