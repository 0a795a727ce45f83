"""Loads the native libraries and registers what PyTorch needs around the C++ ops: fake kernels
(shapes for torch.compile and meta tensors) here, derivatives in autograd.py, batching rules in vmap.py.

torch.ops.linrec.forward(inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None, log_coeffs=False,
                         threads_per_sequence=0, vectors_per_thread=0) -> outputs
torch.ops.linrec.backward(d_outputs, coeffs, outputs, dim, reverse, initial, cu_seqlens, log_coeffs, ...)
    -> (d_inputs, d_coeffs, d_initial)
Schemas and semantics are declared in csrc/kernels/schemas.cpp. The two config ints force a CUDA
kernel configuration (tuning, experiments); 0 and 0 choose one per shape.

torch.ops.linrec.triton_forward and torch.ops.linrec.triton_backward are the same ops run by the Triton
kernels (triton/), declared here from the compiled ops' schemas; their two config ints force a tile
(block_length, block_channels). triton is imported at their first call, not here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .checks import check_arguments, check_backward_arguments
from .runtime import build_info

MIN_TORCH = (2, 10)
_LIBRARY_DIR = Path(__file__).parent.parent  # the package's directory, where setup.py builds the libraries
_CPU_LIBRARY = _LIBRARY_DIR / "_C.so"
_CUDA_LIBRARY = _LIBRARY_DIR / "_C_cuda.so"


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


if _torch_version() < MIN_TORCH:
    _built = build_info()
    raise ImportError(
        f"linrec {_built['version']} needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its libraries use the LibTorch "
        f"stable ABI of torch {_built['torch_target'] or '2.10'}, built with torch {_built['built_with_torch']}), "
        f"found torch {torch.__version__}: upgrade torch"
    )

torch.ops.load_library(str(_CPU_LIBRARY))

#: True when this build holds CUDA kernels and the installed torch can run them.
HAS_CUDA_KERNELS = _CUDA_LIBRARY.exists() and torch.version.cuda is not None
if HAS_CUDA_KERNELS:
    try:
        torch.ops.load_library(str(_CUDA_LIBRARY))
    except OSError as error:
        raise ImportError(
            f"linrec: could not load its CUDA kernels ({_CUDA_LIBRARY.name}) into torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}): {error}"
        ) from error


_TRITON_LIBRARY = torch.library.Library("linrec", "FRAGMENT")
# The Triton ops take the compiled ops' schemas: the same arguments, the two config ints named for a tile.
_TRITON_CONFIG_NAMES = {"threads_per_sequence": "block_length", "vectors_per_thread": "block_channels"}


def _triton_schema(op: torch._ops.OpOverload) -> str:
    """The schema of op's Triton twin: ``triton_<name>``, with the config arguments renamed."""
    schema = str(op._schema).removeprefix("linrec::")
    for name, triton_name in _TRITON_CONFIG_NAMES.items():
        assert f"int {name}=" in schema, f"linrec: the schema of {op} has no config argument {name}"
        schema = schema.replace(f"int {name}=", f"int {triton_name}=")
    return f"triton_{schema}"


_TRITON_LIBRARY.define(_triton_schema(torch.ops.linrec.forward.default))
_TRITON_LIBRARY.define(_triton_schema(torch.ops.linrec.backward.default))


def _triton_launch():
    from .triton import missing

    problem = missing()
    if problem is not None:
        raise RuntimeError(problem)
    from .triton import launch

    return launch


def _triton_forward(*args, **kwargs) -> torch.Tensor:
    return _triton_launch().forward(*args, **kwargs)


def _triton_backward(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _triton_launch().backward(*args, **kwargs)


# CPU tensors run on Triton's interpreter only; launch.py says so where it is not on.
for _key in ("CPU", "CUDA"):
    _TRITON_LIBRARY.impl("triton_forward", _triton_forward, _key)
    _TRITON_LIBRARY.impl("triton_backward", _triton_backward, _key)


def _fake_kernels(prefix: str):
    """The fake kernels of the ops ``linrec::<prefix>forward`` and ``linrec::<prefix>backward``: the checks
    of their arguments, and results of the shapes, dtypes and layouts their kernels give. The config ints
    (named differently by the two families) do not change the results' shapes."""
    forward_op, backward_op = f"linrec.{prefix}forward", f"linrec.{prefix}backward"

    def forward_fake(inputs, coeffs, dim=-1, reverse=False, initial=None, cu_seqlens=None, log_coeffs=False,
                     *_config, **_config_by_name) -> torch.Tensor:
        check_arguments(forward_op, inputs, coeffs, dim, initial, cu_seqlens, log_coeffs)
        return torch.empty_like(inputs)  # as the C++ op allocates: inputs' strides where inputs are dense

    def backward_fake(d_outputs, coeffs, outputs, dim=-1, reverse=False, initial=None, cu_seqlens=None,
                      log_coeffs=False, *_config, **_config_by_name) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_backward_arguments(backward_op, d_outputs, coeffs, outputs, dim, initial, cu_seqlens, log_coeffs)
        # As the C++ op allocates: each gradient in its argument's dtype (coeffs and initial may be float32
        # with 16-bit d_outputs), d_coeffs in coeffs' shape, laid out like outputs where the shapes agree, and
        # an empty d_initial of d_outputs' dtype without an initial state.
        if coeffs.shape == outputs.shape:
            d_coeffs = torch.empty_like(outputs, dtype=coeffs.dtype)
        else:
            d_coeffs = coeffs.new_empty(coeffs.shape)
        d_initial = d_outputs.new_zeros((0,)) if initial is None else initial.new_zeros(initial.shape)
        return torch.empty_like(outputs), d_coeffs, d_initial

    return forward_fake, backward_fake


for _prefix in ("", "triton_"):
    _forward_fake, _backward_fake = _fake_kernels(_prefix)
    torch.library.register_fake(f"linrec::{_prefix}forward", _forward_fake)
    torch.library.register_fake(f"linrec::{_prefix}backward", _backward_fake)
