"""What the installed libraries were built for, and whether this machine can run them: the build
record that setup.py writes beside the libraries, the NVIDIA driver's CUDA version, and the check
that turns a mismatch into one message naming what was built and what was found."""

from __future__ import annotations

import ctypes
import json
from functools import cache
from pathlib import Path
from typing import Any

from .._version import __version__

_BUILD_INFO = Path(__file__).parent.parent / "_build_info.json"  # beside the libraries


@cache
def build_info() -> dict[str, Any]:
    """The build record: version, torch_target (the oldest torch the libraries load into),
    built_with_torch, cuda (the toolkit's release, None for a CPU-only build), cuda_targets
    (sm_XY: machine code for compute capability X.Y; compute_XY: PTX, compiled by the driver for X.Y
    and newer) and, with CUDA, pipe_tile_shapes (the CUDA kernels' tile shapes by kind)."""
    if not _BUILD_INFO.exists():  # a tree whose libraries were built by other means (CMake)
        return {"version": __version__, "torch_target": None, "built_with_torch": None, "cuda": None,
                "cuda_targets": []}
    return json.loads(_BUILD_INFO.read_text())


def cuda_driver_version() -> int | None:
    """The newest CUDA version the NVIDIA driver supports, as 1000 * major + 10 * minor (13000 for
    13.0), or None where no driver is installed."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def cuda_version_name(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def targets_for(cuda_targets: list[str], capability: tuple[int, int]) -> list[str]:
    """The build's targets that run on a GPU of `capability`: machine code of the same major and an
    equal or lower minor, or PTX of an equal or lower capability (compiled by the driver)."""
    major, minor = capability
    runs = []
    for target in cuda_targets:
        kind, _, number = target.partition("_")
        target_major, target_minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and target_major == major and target_minor <= minor:
            runs.append(target)
        elif kind == "compute" and (target_major, target_minor) <= (major, minor):
            runs.append(target)
    return runs


def cuda_problem(info: dict[str, Any], driver_version: int | None, gpu_name: str,
                 capability: tuple[int, int]) -> str | None:
    """Why the build's CUDA kernels cannot run on this GPU, or None when they can."""
    if info["cuda"] is None:
        return None  # builds by other means record nothing; the libraries check the GPU themselves
    built = f"linrec {info['version']} was built with CUDA {info['cuda']} for {', '.join(info['cuda_targets'])}"
    needed_major = int(info["cuda"].split(".")[0])
    if driver_version is None:
        return f"{built}; no NVIDIA driver was found (libcuda.so.1)"
    if driver_version // 1000 < needed_major:
        return (f"{built}, which needs an NVIDIA driver for CUDA {needed_major}.0 or newer; the installed driver "
                f"supports CUDA {cuda_version_name(driver_version)}: update the driver, or install the linrec "
                f"wheel built with CUDA {driver_version // 1000}")
    if not targets_for(info["cuda_targets"], capability):
        return (f"{built}; the GPU {gpu_name} has compute capability {capability[0]}.{capability[1]}, which none "
                "of them runs on: build linrec from source with LINREC_CUDA_ARCHS naming it, or pass backend='hop'")
    return None
