"""linrec behind the interfaces of the Mamba ecosystem: mamba_ssm's and causal-conv1d's functions, with their
signatures and semantics, served by linrec's ops (:mod:`.mamba`, :mod:`.conv`); the module paths code imports
them from (:func:`install_namespaces`); and transformers' Mamba models on them (:mod:`.transformers`).

For example (``install_namespaces`` changes ``sys.modules`` for the whole process)::

    import linrec.integrations
    linrec.integrations.install_namespaces()   # ['causal_conv1d', 'mamba_ssm'] where neither is installed
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn   # linrec's
"""

from __future__ import annotations

from .conv import causal_conv1d_fn, causal_conv1d_update
from .mamba import mamba_inner_fn, selective_scan_fn, selective_state_update
from .namespaces import install_namespaces

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "install_namespaces",
    "mamba_inner_fn",
    "selective_scan_fn",
    "selective_state_update",
]
