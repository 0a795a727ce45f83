"""Prints what linrec was built for and what this machine runs: ``python -m linrec info``.

The build: version, CUDA release and targets of the kernels, the oldest torch the libraries load
into. The runtime: Python, torch and its CUDA, the CPU (model, cores, torch's threads, the instruction set
of the CPU kernels), the NVIDIA driver, each GPU and which of the build's targets run on it, and, where the
build's kernels cannot run, why. Paste it into bug reports.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

import torch

from .._core.library import _CUDA_LIBRARY, HAS_CUDA_KERNELS
from .._core.runtime import build_info, cuda_driver_version, cuda_problem, cuda_version_name, targets_for
from .guard import cpu_description


def report() -> list[str]:
    """The lines ``python -m linrec info`` prints."""
    info = build_info()
    if info["built_with_torch"] is None:
        build = "no build record (libraries built outside setup.py)"
    else:
        kernels = (f"CUDA {info['cuda']} kernels for {', '.join(info['cuda_targets'])}" if info["cuda"]
                   else "CPU kernels only")
        build = f"{kernels}; LibTorch stable ABI for torch >= {info['torch_target']}, built with torch {info['built_with_torch']}"
    driver = cuda_driver_version()
    gpus = []  # (name, capability, the build's targets that run on it, why the build cannot run on it)
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        name, capability = torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)
        gpus.append((name, capability, targets_for(info["cuda_targets"], capability),
                     cuda_problem(info, driver, name, capability)))
    lines = [
        f"linrec {info['version']}",
        f"  build: {build}",
        f"  python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        f"  {cpu_description()}",
        f"  NVIDIA driver: {'supports CUDA ' + cuda_version_name(driver) if driver else 'none found'}",
        f"  CUDA kernels loaded: {cuda_kernels_state(info, driver, [problem for *_, problem in gpus])}",
    ]
    if not gpus:
        lines.append("  GPUs: none visible to torch")
    for index, (name, capability, runs, problem) in enumerate(gpus):
        lines.append(f"  GPU {index}: {name}, compute capability {capability[0]}.{capability[1]}, "
                     f"runs {', '.join(runs) if runs else 'none of the build targets'}")
        if problem is not None:
            lines.append(f"    problem: {problem}")
    return lines


def cuda_kernels_state(info: dict[str, Any], driver: int | None, gpu_problems: list[str | None]) -> str:
    """HAS_CUDA_KERNELS and, where the CUDA kernels are not loaded or cannot run on any GPU here, the
    first reason why: the one thing to fix before the next matters."""
    if not HAS_CUDA_KERNELS:
        if torch.version.cuda is None:  # no CUDA kernels load into this torch, whatever the build holds
            return (f"False, as torch {torch.__version__} was built without CUDA (torch.version.cuda is None): "
                    "install a CUDA build of torch")
        if info["built_with_torch"] is not None and info["cuda"] is None:
            return ("False, as this build holds the CPU kernels only (it was built without nvcc, without a GPU "
                    "or LINREC_CUDA_ARCHS, or with LINREC_NO_CUDA)")
        return f"False, as this build has no CUDA library ({_CUDA_LIBRARY.name}) beside its CPU one"
    if driver is None:
        return "True, but they cannot run: no NVIDIA driver was found (libcuda.so.1)"
    if not gpu_problems:
        return ("True, but they cannot run: torch sees no GPU (torch.cuda.is_available() is False: no GPU, "
                "CUDA_VISIBLE_DEVICES hides them, or the driver is older than torch's CUDA)")
    if all(problem is not None for problem in gpu_problems):
        return "True, but they run on none of the GPUs (each GPU's problem follows)"
    return "True"


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m linrec info", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("\n".join(report()))
    sys.stdout.flush()
