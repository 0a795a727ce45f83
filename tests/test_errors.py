"""Every bad input raises a clear Python exception naming the argument, what was expected and
what was given; the ops themselves (torch.ops.linrec.*) check too."""

from __future__ import annotations

import pytest
import torch

import linrec
from linrec._core.checks import api_error

X = torch.randn(3, 5)
C = torch.rand(3, 5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(inputs=X, coeffs=torch.rand(3, 4)), ValueError, r"coeffs must be broadcastable to the shape of inputs \[3, 5\], got \[3, 4\]"),
        (dict(inputs=X, coeffs=torch.rand(3)), ValueError, r"coeffs must be broadcastable to the shape of inputs"),
        (dict(inputs=X, coeffs=torch.rand(2, 3, 5)), ValueError, r"coeffs must be broadcastable"),
        (dict(inputs=X, coeffs=C.double()), TypeError, r"coeffs must have the dtype of inputs \(torch.float32\), got torch.float64"),
        (dict(inputs=X.int(), coeffs=C.int()), TypeError, r"inputs must be float32, float64, float16, bfloat16, complex64 or complex128, got torch.int32"),
        (dict(inputs=X > 0, coeffs=C > 0), TypeError, r"inputs must be .*got torch.bool"),
        (dict(inputs=X, coeffs=C.to("meta")), ValueError, r"coeffs must be on the device of inputs \(cpu\), got meta"),
        (dict(inputs=X.tolist(), coeffs=C), TypeError, r"inputs must be a torch.Tensor, got list"),
        (dict(inputs=X, coeffs=None), TypeError, r"coeffs must be a torch.Tensor, got NoneType"),
        (dict(inputs=torch.tensor(1.0), coeffs=torch.tensor(1.0)), ValueError, r"inputs must have at least one dim"),
        (dict(inputs=X, coeffs=C, dim=2), IndexError, r"dim must be in \[-2, 1\] for a 2-dim tensor, got 2"),
        (dict(inputs=X, coeffs=C, dim=-3), IndexError, r"dim must be in \[-2, 1\]"),
        (dict(inputs=X, coeffs=C, dim=1.0), TypeError, r"dim must be an int, got float"),
        (dict(inputs=X, coeffs=C, reverse="yes"), TypeError, r"reverse must be a bool, got str"),
        (dict(inputs=X, coeffs=C, initial=torch.rand(5)), ValueError, r"initial must have shape \[3\] \(the shape of inputs without the time dim\), got \[5\]"),
        (dict(inputs=X, coeffs=C, dim=0, initial=torch.rand(3)), ValueError, r"initial must have shape \[5\]"),
        (dict(inputs=X, coeffs=C, initial=torch.rand(3).double()), TypeError, r"initial must have the dtype of inputs"),
        (dict(inputs=X, coeffs=C, initial=[0.0] * 3), TypeError, r"initial must be a torch.Tensor, got list"),
        (dict(inputs=X, coeffs=C, log_coeffs=1), TypeError, r"log_coeffs must be a bool, got int"),
        (dict(inputs=X.cfloat(), coeffs=C.cfloat(), log_coeffs=True), ValueError, r"log_coeffs=True takes real coefficients"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 3, 2, 5])), ValueError, r"cu_seqlens must be non-decreasing, got 3 then 2 at index 2"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 3, 4])), ValueError, r"cu_seqlens must end at the length of the time dim \(5\), got 4"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([1, 3, 5])), ValueError, r"cu_seqlens must start at 0, got 1"),
        (dict(inputs=X, coeffs=C, cu_seqlens=torch.tensor([0, 2, 5])), ValueError, r"with cu_seqlens, inputs packs its sequences along dim 1 and must have a batch dim \(dim 0\) of size 1 before it, got shape \[3, 5\]"),
        (dict(inputs=X[0], coeffs=C[0], cu_seqlens=torch.tensor([0, 2, 5])), ValueError, r"must have a batch dim \(dim 0\) of size 1"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0.0, 5.0])), TypeError, r"cu_seqlens must be int32 or int64, got torch.float32"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 9, 2, 9, 5])[::2]), ValueError, r"cu_seqlens must be contiguous, got stride 2"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([5])), ValueError, r"cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape \[1\]"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 2, 5]), initial=torch.rand(1, 3)), ValueError, r"initial must have shape \[2, 3\] \(the shape of inputs without the time dim, dim 0 counting the cu_seqlens sequences\), got \[1, 3\]"),
        (dict(inputs=X, coeffs=C, backend="cuda"), ValueError, r"backend must be one of 'auto', 'triton', 'loop', 'hop', 'heinsen', got 'cuda'"),
    ],
)
def test_public_api_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        linrec.linrec(**kwargs)


def test_offsets_changed_in_place_are_checked_again(device):
    """Valid offsets are checked once per tensor; changed in place, or against another length, again."""
    inputs, coeffs = X[None].to(device), C[None].to(device)
    offsets = torch.tensor([0, 2, 5], device=device)
    linrec.linrec(inputs, coeffs, cu_seqlens=offsets)
    with pytest.raises(ValueError, match=r"cu_seqlens must end at the length of the time dim \(4\), got 5"):
        linrec.linrec(inputs[..., :4], coeffs[..., :4], cu_seqlens=offsets)
    offsets[1] = 6
    with pytest.raises(ValueError, match=r"cu_seqlens must be non-decreasing, got 6 then 5 at index 2"):
        linrec.linrec(inputs, coeffs, cu_seqlens=offsets)


# What the C++ ops' argument errors arrive as, called directly (linrec.linrec raises the type their message
# ends with, or ValueError, on every torch): ValueError up to torch 2.13; torch 2.15's stable ABI hands
# them over as RuntimeError (seen with 2.15.0); 2.14 not yet run, so either.
OP_ERRORS = (ValueError,) if tuple(int(n) for n in torch.__version__.split(".")[:2]) <= (2, 13) else (ValueError, RuntimeError)


OP_CASES = [
    ((X, torch.rand(3, 4)), {}, r"linrec.forward: coeffs must be broadcastable to the shape of inputs \[3, 5\], got \[3, 4\]"),
    ((X, C.double()), {}, r"linrec.forward: coeffs must have the dtype of inputs"),
    # 16-bit inputs take float32 coeffs and initial too (mixed precision), and no other dtype.
    ((X.bfloat16(), C.half()), {}, r"linrec.forward: coeffs must have the dtype of inputs"),
    ((X.half(), C), dict(initial=torch.rand(3).double()), r"linrec.forward: initial must have the dtype of inputs"),
    ((X.double(), C.double()), dict(initial=torch.rand(3)), r"linrec.forward: initial must have the dtype of inputs"),
    ((X.long(), C.long()), {}, r"linrec.forward: inputs must be float32, float64, float16, bfloat16, complex64 or complex128, got torch.int64"),
    ((torch.tensor(1.0), torch.tensor(1.0)), {}, r"linrec.forward: inputs must have at least one dim"),
    ((X, C), dict(dim=2), r"linrec.forward: dim must be in \[-2, 1\] for a 2-dim tensor, got 2"),
    ((X, C), dict(initial=torch.rand(5)), r"linrec.forward: initial must have shape \[3\]"),
    ((X.cdouble(), C.cdouble()), dict(log_coeffs=True), r"linrec.forward: log_coeffs=True takes real coefficients"),
    ((X[None], C[None]), dict(cu_seqlens=torch.tensor([0, 3, 2, 5])), r"linrec.forward: cu_seqlens must be non-decreasing"),
    ((X[None], C[None]), dict(cu_seqlens=torch.tensor([0, 3, 6])), r"linrec.forward: cu_seqlens must end at the length of the time dim \(5\), got 6"),
    ((X[None], C[None]), dict(cu_seqlens=torch.tensor([0, 9, 5])[::2]), r"linrec.forward: cu_seqlens must be contiguous, got stride 2"),
    ((X, C), dict(cu_seqlens=torch.tensor([0, 5])), r"linrec.forward: with cu_seqlens, inputs .* batch dim \(dim 0\) of size 1"),
]


@pytest.mark.parametrize("args, kwargs, message", OP_CASES)
def test_forward_op_checks_its_arguments(args, kwargs, message):
    with pytest.raises(OP_ERRORS, match=message):
        torch.ops.linrec.forward(*args, **kwargs)


def _meta(value):
    """A meta tensor of value's shape, strides and dtype."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")


@pytest.mark.parametrize("args, kwargs, message", [case for case in OP_CASES if "cu_seqlens must" not in case[2]
                                                   or "contiguous" in case[2]])
def test_fake_kernels_raise_what_the_op_raises(args, kwargs, message):
    """The C++ op's checks and the fake kernel's (which torch.compile and meta tensors run) give the same
    message, and the exception type the op's message stands for (the offsets' values are not on meta)."""
    with pytest.raises(OP_ERRORS) as op_error:
        torch.ops.linrec.forward(*args, **kwargs)
    with pytest.raises((TypeError, ValueError, IndexError)) as fake_error:
        torch.ops.linrec.forward(*map(_meta, args), **{name: _meta(value) for name, value in kwargs.items()})
    from_op, from_fake = api_error("linrec", op_error.value), api_error("linrec", fake_error.value)
    assert (type(from_op), str(from_op)) == (type(from_fake), str(from_fake))


def test_backward_op_checks_its_arguments():
    with pytest.raises(OP_ERRORS, match=r"linrec.backward: outputs must have shape \[3, 5\] \(the shape of d_outputs\), got \[5, 3\]"):
        torch.ops.linrec.backward(X, C, X.t().contiguous())
    with pytest.raises(OP_ERRORS, match=r"linrec.backward: coeffs must have the dtype of d_outputs"):
        torch.ops.linrec.backward(X, C.half(), X)
    with pytest.raises(OP_ERRORS, match=r"linrec.backward: coeffs must have the dtype of d_outputs"):
        torch.ops.linrec.backward(X.bfloat16(), C.double(), X.bfloat16())


@pytest.mark.cuda
def test_mixed_cpu_and_cuda_operands():
    if not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS):
        pytest.skip("needs a CUDA GPU and linrec's CUDA kernels")
    with pytest.raises(ValueError, match=r"coeffs must be on the device of inputs \(cpu\), got cuda:0"):
        linrec.linrec(X, C.cuda())
    with pytest.raises(OP_ERRORS, match=r"linrec.forward: coeffs must be on the device of inputs \(cuda:0\), got cpu"):
        torch.ops.linrec.forward(X.cuda(), C)
    with pytest.raises(OP_ERRORS, match=r"linrec.forward: cu_seqlens must be on the device of inputs \(cuda:0\), got cpu"):
        torch.ops.linrec.forward(X[None].cuda(), C[None].cuda(), cu_seqlens=torch.tensor([0, 5]))
