"""Shared fixtures: the device parametrization and NaN-poisoned allocations."""

from __future__ import annotations

import os
import random

import pytest
import torch

# Without a GPU, the Triton backend's kernels run on CPU tensors through Triton's interpreter, which Triton
# reads when the kernels are first imported (at their first call, after this).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import linrec  # noqa: E402

_CUDA_USABLE = torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS

#: Every test that takes `device` runs on the CPU and, marked `cuda`, on the GPU when there is one.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not _CUDA_USABLE, reason="needs a CUDA GPU and linrec's CUDA kernels")],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def poison_allocations():
    """Every torch.empty (the ops' output buffers too) comes back filled with NaN, so an element a
    kernel forgets to write fails the comparison instead of passing on leftover memory."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed on failure so the case can be replayed."""
    value = random.randrange(2**31)
    torch.manual_seed(value)
    print(f"seed={value}")
    return value
