"""Prints what linrec was built for and what this machine runs: ``python -m linrec info``.

The build: version, CUDA release and targets of the kernels, the oldest torch the libraries load
into. The runtime: Python, torch and its CUDA, the NVIDIA driver, each GPU and which of the build's
targets run on it, and, where the build's kernels cannot run, why. Paste it into bug reports.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch

from .._core.library import HAS_CUDA_KERNELS
from .._core.runtime import build_info, cuda_driver_version, cuda_problem, cuda_version_name, targets_for


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
    lines = [
        f"linrec {info['version']}",
        f"  build: {build}",
        f"  python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        f"  NVIDIA driver: {'supports CUDA ' + cuda_version_name(driver) if driver else 'none found'}",
        f"  CUDA kernels loaded: {HAS_CUDA_KERNELS}",
    ]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        lines.append("  GPUs: none visible to torch")
    for index in range(gpus):
        name, capability = torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)
        runs = targets_for(info["cuda_targets"], capability)
        lines.append(f"  GPU {index}: {name}, compute capability {capability[0]}.{capability[1]}, "
                     f"runs {', '.join(runs) if runs else 'none of the build targets'}")
        problem = cuda_problem(info, driver, name, capability)
        if problem is not None:
            lines.append(f"    problem: {problem}")
    return lines


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m linrec info", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("\n".join(report()))
    sys.stdout.flush()
