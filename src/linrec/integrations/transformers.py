"""transformers' Mamba models (Mamba, FalconMamba, Jamba's Mamba layers) on linrec, without mamba_ssm or
causal-conv1d installed: :func:`enable`.

transformers' model modules take mamba_ssm's and causal-conv1d's functions where those packages import,
and fall back to slow PyTorch code where they do not. :func:`enable` registers linrec's stand-ins for the
packages (:func:`linrec.integrations.install_namespaces`), imports the Mamba-family model modules and sets
their functions to linrec's, so that every model of those classes, built before or after, calls linrec:
the training forward (``mamba_inner_fn``), the prefill (``causal_conv1d_fn``, ``selective_scan_fn``) and each
decoding step (``causal_conv1d_update``, ``selective_state_update``), on the GPU and on the CPU.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable

from . import conv, mamba
from .namespaces import install_namespaces

__all__ = ["MODELS", "enable"]

#: The transformers models whose Mamba layers :func:`enable` serves (Mamba-1's selective scan).
MODELS = ("mamba", "falcon_mamba", "jamba")
#: The model modules' names for the functions, across transformers' releases (4.x imports mamba_ssm's names,
#: 5.x wraps its own fallbacks under its names).
_FUNCTIONS: dict[str, Callable] = {
    "causal_conv1d_fn": conv.causal_conv1d_fn,
    "causal_conv1d_update": conv.causal_conv1d_update,
    "mamba_inner_fn": mamba.mamba_inner_fn,
    "selective_scan_fn": mamba.selective_scan_fn,
    "mamba_selective_scan": mamba.selective_scan_fn,
    "selective_state_update": mamba.selective_state_update,
    "mamba_selective_state_update": mamba.selective_state_update,
}


def enable() -> list[str]:
    """Makes transformers' Mamba-family models run on linrec; returns the model modules it set, by name.

    Needs transformers installed (ImportError otherwise). Where mamba_ssm or causal-conv1d is installed, their
    modules stay importable for other code, but these models call linrec's functions all the same. transformers
    4.x takes the functions only on CUDA tensors (its ``cuda_kernels_forward``); 5.x on every device.
    """
    import transformers  # noqa: F401  (a clear ImportError where it is not installed)

    install_namespaces()
    enabled = []
    for model in MODELS:
        try:
            module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
        except ImportError:  # a release without this model
            continue
        for name, function in _FUNCTIONS.items():
            if hasattr(module, name):
                setattr(module, name, _dropping_unknown_keywords(function))
        if hasattr(module, "is_fast_path_available"):
            module.is_fast_path_available = True
        enabled.append(module.__name__)
    return enabled


def _dropping_unknown_keywords(function: Callable) -> Callable:
    """``function``, called with the keyword arguments it takes: transformers' fallbacks take more (such as
    ``use_mambapy``), which mamba_ssm's signatures lack, and transformers' own loader drops them the same way."""
    known = set(inspect.signature(function).parameters)

    @functools.wraps(function)
    def call(*args, **kwargs):
        return function(*args, **{key: value for key, value in kwargs.items() if key in known})

    return call

