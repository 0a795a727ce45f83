"""The module paths that Mamba code imports mamba_ssm's and causal-conv1d's functions from, served by linrec.

:func:`install_namespaces` registers, in ``sys.modules``, the modules ``mamba_ssm``,
``mamba_ssm.ops.selective_scan_interface``, ``mamba_ssm.ops.triton.selective_state_update``, ``causal_conv1d`` and
``causal_conv1d.causal_conv1d_interface`` (and the packages between them), holding linrec's implementations
(:mod:`.mamba`, :mod:`.conv`): ``from mamba_ssm.ops.selective_scan_interface import selective_scan_fn`` then
gives linrec's. The five names are on the top-level modules too, where transformers' kernel loader reads them.
The modules carry no ``__version__``: code that needs a newer mamba_ssm (Mamba-2's SSD kernels) does not take
them for it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

from . import conv, mamba

__all__ = ["NAMESPACES", "install_namespaces"]

#: Module path -> the names it holds, from linrec's implementations; the packages between are created too.
NAMESPACES = {
    "mamba_ssm": {"selective_scan_fn": mamba.selective_scan_fn, "mamba_inner_fn": mamba.mamba_inner_fn,
                  "selective_state_update": mamba.selective_state_update},
    "mamba_ssm.ops.selective_scan_interface": {"selective_scan_fn": mamba.selective_scan_fn,
                                               "mamba_inner_fn": mamba.mamba_inner_fn},
    "mamba_ssm.ops.triton.selective_state_update": {"selective_state_update": mamba.selective_state_update},
    "causal_conv1d": {"causal_conv1d_fn": conv.causal_conv1d_fn, "causal_conv1d_update": conv.causal_conv1d_update},
    "causal_conv1d.causal_conv1d_interface": {"causal_conv1d_fn": conv.causal_conv1d_fn,
                                              "causal_conv1d_update": conv.causal_conv1d_update},
}
_MARK = "__linrec_namespace__"


def install_namespaces(replace: bool = False) -> list[str]:
    """Registers linrec's ``mamba_ssm`` and ``causal_conv1d`` modules in ``sys.modules``; returns the top-level
    names it registered (or had registered), sorted.

    A package that is installed (importable) is left alone unless ``replace``: then linrec's modules take its
    place in this process (its modules already imported stay as they are, under their names). Call it before
    the code that imports those modules is imported (transformers' model modules resolve the functions when
    they are imported; :func:`linrec.integrations.transformers.enable` also updates those already imported).
    """
    installed = []
    for top in sorted({path.split(".")[0] for path in NAMESPACES}):
        current = sys.modules.get(top)
        if current is not None and getattr(current, _MARK, False):
            installed.append(top)
            continue
        if not replace and (current is not None or importlib.util.find_spec(top) is not None):
            continue
        for name in [name for name in sys.modules if name == top or name.startswith(top + ".")]:
            del sys.modules[name]
        for path, names in NAMESPACES.items():
            if path.split(".")[0] != top:
                continue
            parts = path.split(".")
            for depth in range(1, len(parts) + 1):
                module = _module(".".join(parts[:depth]))
                if depth > 1:
                    setattr(sys.modules[".".join(parts[:depth - 1])], parts[depth - 1], module)
            for name, function in names.items():
                setattr(sys.modules[path], name, function)
        installed.append(top)
    return installed


def _module(name: str) -> types.ModuleType:
    """The module ``name`` of linrec's namespaces, created (as a package, with a spec, so that
    importlib.util.find_spec finds it) where it is not yet."""
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, f"linrec's stand-in for {name} (linrec.integrations.namespaces)")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        setattr(module, _MARK, True)
        sys.modules[name] = module
    return module
