"""linrec: the linear recurrence ``y[l] = c[l] * y[l-1] + x[l]`` as a fast, differentiable PyTorch op.

>>> import torch, linrec
>>> x, c = torch.randn(4, 1024), torch.rand(4, 1024)
>>> y = linrec.linrec(x, c)                      # scans the last dim
>>> y_rev = linrec.linrec(x, c, reverse=True)    # from the last element to the first
>>> y_btc = linrec.linrec(x.T, c.T, dim=0)        # any dim is time, strided views are read in place

Bad arguments raise TypeError, IndexError or ValueError by one convention across the package, stated in
src/linrec/_core/checks.py.
"""

from ._core.library import HAS_CUDA_KERNELS
from ._version import __version__
from .conv import causal_conv1d, causal_conv1d_update
from .reference import REFERENCES, linrec_heinsen, linrec_hop, linrec_loop, linrec_reference
from .scan import BACKENDS, last_states, linrec
from .ssm import selective_scan
from .state_update import selective_state_update
from . import conv, distributed, nn, rl, ssm

__all__ = [
    "BACKENDS",
    "HAS_CUDA_KERNELS",
    "REFERENCES",
    "__version__",
    "causal_conv1d",
    "causal_conv1d_update",
    "conv",
    "distributed",
    "last_states",
    "linrec",
    "linrec_heinsen",
    "linrec_hop",
    "linrec_loop",
    "linrec_reference",
    "nn",
    "rl",
    "selective_scan",
    "selective_state_update",
    "ssm",
]


def __dir__() -> list[str]:
    """The public names: the modules the package imports for its own use (scan, reference, _core) stay out."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__") and name.endswith("__"))})
