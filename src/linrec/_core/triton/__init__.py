"""The Triton backend (``backend="triton"``): tile and pipe scans written in Triton, for GPUs the
compiled CUDA kernels do not run on (ROCm, architectures the wheel was not built for, CPU-only wheels),
and for the CPU through Triton's interpreter (``TRITON_INTERPRET=1``).

kernels.py holds the kernels, layout.py maps a call's strided operands onto them, configs.py chooses
their tiles, launch.py implements the ops. Importing this package does not import triton: the ops
are registered with every install, and triton is loaded at their first call.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Looked up once: a plain constant, which torch.compile reads without tracing the lookup.
_INSTALLED = importlib.util.find_spec("triton") is not None


def missing() -> str | None:
    """Why the Triton backend cannot run here (triton not installed), or None."""
    if not _INSTALLED:
        return ("linrec: backend='triton' needs the triton package, which is not installed: "
                "pip install triton (or pip install 'linrec[triton]')")
    return None


def check_dtype(op: str, dtype: torch.dtype) -> None:
    """The Triton kernels take real dtypes; complex recurrences run on the compiled kernels."""
    if dtype.is_complex:
        raise TypeError(
            f"{op}: backend='triton' takes torch.float32, torch.float64, torch.float16 or torch.bfloat16, got {dtype}; "
            "complex recurrences run on backend='auto'"
        )
