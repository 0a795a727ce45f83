"""The plumbing below the public modules; nothing here is public API.

linrec's layers: the package's top-level modules are its public face (``linrec.linrec`` in scan.py, the
references, ``ssm``, ``nn``, ``rl``, ``distributed``); this subpackage holds what they stand on: the native
libraries and the ops' registration (library.py), their derivatives (autograd.py) and batching rules
(vmap.py), the shifts along a sequence the derivatives use (steps.py), argument checks (checks.py), the
build record and runtime checks (runtime.py), the backend choice (backend.py) and the Triton backend
(triton/); the command-line tools live apart in ``linrec.tools``, run as ``python -m linrec <tool>``.
Public modules import from here and from each other, never the package itself; nothing here imports a
public module.

Importing this package loads the libraries and registers the ops with their derivatives and batching rules.
"""

# library loads the libraries and declares the Triton ops, on which autograd and vmap register the derivatives
# and batching rules.
from . import library
from . import autograd, vmap

__all__ = ["autograd", "library", "vmap"]
