"""The backend choice: which op family (``autograd.COMPILED`` or ``autograd.TRITON``) runs a call, and the
device checks that refuse the calls no family can run."""

from __future__ import annotations

from functools import cache

import torch

from .autograd import COMPILED, TRITON, Kernels
from .library import HAS_CUDA_KERNELS
from .runtime import build_info, cuda_driver_version, cuda_problem
from .triton import check_dtype as _triton_check_dtype
from .triton import missing as _triton_missing

_KERNEL_DEVICES = ("cpu", "cuda", "meta")


def choose(backend: str, inputs: torch.Tensor) -> Kernels:
    """The op family ``backend`` ("auto" or "triton") runs on these inputs; raises where it cannot run them."""
    if backend == "triton":
        _check_triton_device(inputs)
        return TRITON
    if _auto_runs_triton(inputs):
        return TRITON
    _check_kernel_device(inputs)
    return COMPILED


def _check_kernel_device(inputs: torch.Tensor) -> None:
    if inputs.device.type not in _KERNEL_DEVICES:
        raise ValueError(
            f"linrec: the compiled kernels run on cpu and cuda tensors, got {inputs.device}; "
            "backend='hop' runs on any device torch supports"
        )
    if inputs.is_cuda and not HAS_CUDA_KERNELS:
        raise RuntimeError(
            "linrec: this build has no CUDA kernels (it was built without nvcc, with LINREC_NO_CUDA, or torch "
            "has no CUDA); reinstall linrec with CUDA, install triton (backend='auto' then runs the Triton "
            "kernels), or pass backend='hop'"
        )
    if inputs.is_cuda and not torch.compiler.is_compiling():
        problem = cuda_device_problem(inputs.device.index if inputs.device.index is not None
                                      else torch.cuda.current_device())
        if problem is not None:
            raise RuntimeError(f"linrec: {problem} (python -m linrec info prints the build and this machine)")


def _check_triton_device(inputs: torch.Tensor) -> None:
    problem = _triton_missing()
    if problem is not None:
        raise RuntimeError(problem)
    _triton_check_dtype("linrec", inputs.dtype)
    if not (inputs.is_cuda or inputs.is_cpu or inputs.is_meta):
        raise ValueError(f"linrec: backend='triton' runs on GPU tensors (CUDA or ROCm), got {inputs.device}")


def _auto_runs_triton(inputs: torch.Tensor) -> bool:
    """Whether backend='auto' takes the Triton kernels: for real GPU tensors where the compiled CUDA kernels
    cannot run (no CUDA kernels in this build, ROCm, a GPU the build has no code for) and triton is installed."""
    if not inputs.is_cuda or inputs.is_complex():
        return False
    if HAS_CUDA_KERNELS and (torch.compiler.is_compiling() or cuda_device_problem(inputs.device.index) is None):
        return False
    return _triton_missing() is None


@cache
def cuda_device_problem(device_index: int) -> str | None:
    """Why the build's CUDA kernels cannot run on this GPU (driver too old, architecture not built), once
    per GPU, before a launch would fail with a less clear CUDA error."""
    return cuda_problem(build_info(), cuda_driver_version(), torch.cuda.get_device_name(device_index),
                        torch.cuda.get_device_capability(device_index))
