"""linrec: the linear recurrence ``y[l] = c[l] * y[l-1] + x[l]`` as a fast, differentiable PyTorch op.

>>> import torch, linrec
>>> x, c = torch.randn(4, 1024), torch.rand(4, 1024)
>>> y = linrec.linrec(x, c)                      # scans the last dim
>>> y_rev = linrec.linrec(x, c, reverse=True)    # from the last element to the first
>>> y_btc = linrec.linrec(x.T, c.T, dim=0)        # any dim is time, strided views are read in place
"""

from ._core.library import HAS_CUDA_KERNELS
from ._version import __version__
from .reference import REFERENCES, linrec_heinsen, linrec_hop, linrec_loop, linrec_reference
from .scan import BACKENDS, linrec
from .ssm import selective_scan
from . import distributed, nn, rl, ssm

__all__ = [
    "BACKENDS",
    "HAS_CUDA_KERNELS",
    "REFERENCES",
    "__version__",
    "distributed",
    "linrec",
    "linrec_heinsen",
    "linrec_hop",
    "linrec_loop",
    "linrec_reference",
    "nn",
    "rl",
    "selective_scan",
    "ssm",
]
