"""Every bad input raises a clear Python exception naming the argument, what was expected and
what was given; the ops themselves (torch.ops.linrec.*) check too."""

from __future__ import annotations

import pytest
import torch

import linrec

X = torch.randn(3, 5)
C = torch.rand(3, 5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(inputs=X, coeffs=torch.rand(3, 4)), ValueError, r"coeffs must have the shape of inputs \[3, 5\], got \[3, 4\]"),
        (dict(inputs=X, coeffs=torch.rand(5)), ValueError, r"coeffs must have the shape of inputs"),
        (dict(inputs=X, coeffs=C.double()), TypeError, r"coeffs must have the dtype of inputs \(torch.float32\), got torch.float64"),
        (dict(inputs=X.int(), coeffs=C.int()), TypeError, r"inputs must be float32, float64, float16 or bfloat16, got torch.int32"),
        (dict(inputs=X > 0, coeffs=C > 0), TypeError, r"inputs must be .*got torch.bool"),
        (dict(inputs=X, coeffs=C.to("meta")), ValueError, r"coeffs must be on the device of inputs \(cpu\), got meta"),
        (dict(inputs=X.tolist(), coeffs=C), TypeError, r"inputs must be a torch.Tensor, got list"),
        (dict(inputs=X, coeffs=None), TypeError, r"coeffs must be a torch.Tensor, got NoneType"),
        (dict(inputs=torch.tensor(1.0), coeffs=torch.tensor(1.0)), ValueError, r"inputs must have at least one dim"),
        (dict(inputs=X, coeffs=C, dim=2), IndexError, r"dim must be in \[-2, 1\] for a 2-dim tensor, got 2"),
        (dict(inputs=X, coeffs=C, dim=-3), IndexError, r"dim must be in \[-2, 1\]"),
        (dict(inputs=X, coeffs=C, dim=1.0), TypeError, r"dim must be an int, got float"),
        (dict(inputs=X, coeffs=C, reverse="yes"), TypeError, r"reverse must be a bool, got str"),
        (dict(inputs=X, coeffs=C, backend="cuda"), ValueError, r"backend must be one of 'auto', 'loop', 'hop', 'heinsen', got 'cuda'"),
    ],
)
def test_public_api_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        linrec.linrec(**kwargs)


@pytest.mark.parametrize(
    "args, message",
    [
        ((X, torch.rand(3, 4), False), r"linrec.forward: coeffs must have the shape of inputs \[3, 5\], got \[3, 4\]"),
        ((X, C.double(), False), r"linrec.forward: coeffs must have the dtype of inputs"),
        ((X.long(), C.long(), False), r"linrec.forward: inputs must be float32, float64, float16 or bfloat16, got Long"),
        ((torch.tensor(1.0), torch.tensor(1.0), False), r"linrec.forward: inputs must have at least one dim"),
    ],
)
def test_forward_op_checks_its_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        torch.ops.linrec.forward(*args)


def test_backward_op_checks_its_arguments():
    with pytest.raises(ValueError, match=r"linrec.backward: outputs must have the shape of d_outputs \[3, 5\], got \[5, 3\]"):
        torch.ops.linrec.backward(X, C, X.t().contiguous(), False)
    with pytest.raises(ValueError, match=r"linrec.backward: coeffs must have the dtype of d_outputs"):
        torch.ops.linrec.backward(X, C.half(), X, False)


@pytest.mark.cuda
def test_mixed_cpu_and_cuda_operands():
    if not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS):
        pytest.skip("needs a CUDA GPU and linrec's CUDA kernels")
    with pytest.raises(ValueError, match=r"coeffs must be on the device of inputs \(cpu\), got cuda:0"):
        linrec.linrec(X, C.cuda())
    with pytest.raises(ValueError, match=r"linrec.forward: coeffs must be on the device of inputs \(cuda:0\), got cpu"):
        torch.ops.linrec.forward(X.cuda(), C, False)
