"""Every bad input raises a clear Python exception naming the argument, what was expected and
what was given, by one convention across the layers (src/linrec/_core/checks.py); the ops themselves
(torch.ops.linrec.*) check too. Scalar arguments are taken as torch takes them."""

from __future__ import annotations

import re

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
        (dict(inputs=X.int(), coeffs=C.int()), TypeError, r"inputs must be torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64 or torch.complex128, got torch.int32"),
        (dict(inputs=X > 0, coeffs=C > 0), TypeError, r"inputs must be .*got torch.bool"),
        (dict(inputs=X, coeffs=C.to("meta")), ValueError, r"coeffs must be on the device of inputs \(cpu\), got meta"),
        (dict(inputs=X.tolist(), coeffs=C), TypeError, r"inputs must be a torch.Tensor, got list"),
        (dict(inputs=X, coeffs=None), TypeError, r"coeffs must be a torch.Tensor or a number, got None"),
        (dict(inputs=X, coeffs=True), TypeError, r"coeffs must be a torch.Tensor or a number, got bool"),
        (dict(inputs=X, coeffs=0.5j), TypeError, r"coeffs must be a real number for inputs of torch.float32 \(a complex one needs complex inputs\), got 0.5j"),
        (dict(inputs=torch.tensor(1.0), coeffs=torch.tensor(1.0)), ValueError, r"inputs must have at least one dim"),
        (dict(inputs=X, coeffs=C, dim=2), IndexError, r"dim must be in \[-2, 1\] for a 2-dim tensor, got 2"),
        (dict(inputs=X, coeffs=C, dim=-3), IndexError, r"dim must be in \[-2, 1\]"),
        (dict(inputs=X, coeffs=C, dim=1.0), TypeError, r"dim must be an int, got float"),
        (dict(inputs=X, coeffs=C, reverse="yes"), TypeError, r"reverse must be a bool, got str"),
        (dict(inputs=X, coeffs=C, reverse=1), TypeError, r"reverse must be a bool, got int"),
        (dict(inputs=X, coeffs=C, dim=True), TypeError, r"dim must be an int, got bool"),
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
        # The flash-attention layout, (total, channels) packed along dim 0: the message says how to pass it.
        (dict(inputs=X.T, coeffs=C.T, dim=0, cu_seqlens=torch.tensor([0, 2, 5])), ValueError, r"packs its sequences along dim 0 .* got shape \[5, 3\]; packed sequences need a batch dim of size 1 before the time dim: a tensor x of shape \(total, channels\) packed along dim 0 goes in as x.unsqueeze\(0\) with dim=1$"),
        (dict(inputs=X[0], coeffs=C[0], cu_seqlens=torch.tensor([0, 2, 5])), ValueError, r"must have a batch dim \(dim 0\) of size 1"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0.0, 5.0])), TypeError, r"cu_seqlens must be torch.int32 or torch.int64, got torch.float32"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 9, 2, 9, 5])[::2]), ValueError, r"cu_seqlens must be contiguous, got stride 2"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([5])), ValueError, r"cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape \[1\]"),
        (dict(inputs=X[None], coeffs=C[None], cu_seqlens=torch.tensor([0, 2, 5]), initial=torch.rand(1, 3)), ValueError, r"initial must have shape \[2, 3\] \(the shape of inputs without the time dim, dim 0 counting the cu_seqlens sequences\), got \[1, 3\]"),
        (dict(inputs=X, coeffs=C, backend="cuda"), ValueError, r"backend must be one of 'auto', 'triton', 'loop', 'hop', 'heinsen', got 'cuda'"),
    ],
)
@pytest.mark.parametrize("backend", ["auto", "loop"])
def test_public_api_errors(kwargs, error, message, backend):
    """The compiled kernels' checks (the C++ op's error, translated) and the references' (Python) agree."""
    kwargs = {"backend": backend, **kwargs}
    with pytest.raises(error, match=message) as raised:
        linrec.linrec(**kwargs)
    assert type(raised.value) is error and str(raised.value).startswith("linrec: ")


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
    ((X.long(), C.long()), {}, r"linrec.forward: inputs must be torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64 or torch.complex128, got torch.int64"),
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


# --- one convention across the layers ---------------------------------------------------------------------
# TypeError for a wrong type or dtype, IndexError for a dim out of range, ValueError for a wrong value or shape;
# the message starts with the public name of what raised it, "linrec" first.

U, DELTA, A, B = torch.randn(1, 4, 6), torch.rand(1, 4, 6), -torch.rand(4, 3), torch.randn(1, 3, 6)
REWARDS, VALUES = torch.zeros(5, 3), torch.zeros(6, 3)


LAYER_CASES = [
    pytest.param(lambda: linrec.linrec(X.long(), C.long()), TypeError,
                 r"linrec: inputs must be torch.float32, .* got torch.int64$", id="linrec-dtype"),
    pytest.param(lambda: linrec.linrec(X, C, dim=2), IndexError, r"linrec: dim must be in \[-2, 1\]", id="linrec-dim"),
    pytest.param(lambda: linrec.linrec(X, torch.rand(3, 4)), ValueError, r"linrec: coeffs must be broadcastable",
                 id="linrec-shape"),
    pytest.param(lambda: linrec.last_states([1.0]), TypeError,
                 r"linrec.last_states: outputs must be a torch.Tensor, got list$", id="last_states-type"),
    pytest.param(lambda: linrec.last_states(X[None], torch.tensor([0.0, 5.0])), TypeError,
                 r"linrec.last_states: cu_seqlens must be torch.int32 or torch.int64, got torch.float32$", id="last_states-dtype"),
    pytest.param(lambda: linrec.last_states(X, dim=-3), IndexError, r"linrec.last_states: dim must be in \[-2, 1\]",
                 id="last_states-dim"),
    pytest.param(lambda: linrec.last_states(X, torch.tensor([0, 5])), ValueError,
                 r"linrec.last_states: with cu_seqlens, outputs .* x.unsqueeze\(0\) with dim=1$", id="last_states-shape"),
    pytest.param(lambda: linrec.nn.MinGRU(5, 4)(torch.zeros(2, 3, 5, dtype=torch.int64)), TypeError,
                 r"linrec.nn.MinGRU: x must be torch.float32, torch.float64, torch.bfloat16 or torch.float16, "
                 r"got torch.int64$", id="nn-dtype"),
    pytest.param(lambda: linrec.nn.EMA(5)(torch.zeros(2, 3, 5), torch.zeros(2, 5, dtype=torch.float64)), TypeError,
                 r"linrec.nn.EMA: state must have dtype torch.float32 \(for inputs of this dtype\), got torch.float64$",
                 id="nn-state-dtype"),
    pytest.param(lambda: linrec.nn.LRU(4.0, 8), TypeError, r"linrec.nn.LRU: input_size must be an int, got float$",
                 id="nn-size-type"),
    pytest.param(lambda: linrec.nn.LRU(5, 8)(torch.zeros(3, 5)), ValueError,
                 r"linrec.nn.LRU: x must be a 3-dim tensor \(batch, time, input_size\)", id="nn-shape"),
    pytest.param(lambda: linrec.nn.EMA(0), ValueError, r"linrec.nn.EMA: channels must be a positive int, got 0$",
                 id="nn-size-value"),
    pytest.param(lambda: linrec.rl.gae(REWARDS.long(), VALUES, None, 0.9, 0.9), TypeError,
                 r"linrec.rl.gae: rewards must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, "
                 r"got torch.int64$", id="rl-dtype"),
    pytest.param(lambda: linrec.rl.discounted_returns(REWARDS, "0.9"), TypeError,
                 r"linrec.rl.discounted_returns: gamma must be a number in \[0, 1\] or a tensor, got str$", id="rl-type"),
    pytest.param(lambda: linrec.rl.discounted_returns(REWARDS, 0.9, dim=2), IndexError,
                 r"linrec.rl.discounted_returns: dim must be in \[-2, 1\]", id="rl-dim"),
    pytest.param(lambda: linrec.rl.gae(REWARDS, VALUES, None, 0.9, 1.5), ValueError,
                 r"linrec.rl.gae: lam must be in \[0, 1\], got 1.5$", id="rl-value"),
    pytest.param(lambda: linrec.selective_scan(U.long(), DELTA, A, B, B), TypeError,
                 r"linrec.selective_scan: u must be a real floating-point tensor, got torch.int64$", id="ssm-dtype"),
    pytest.param(lambda: linrec.selective_scan(U, DELTA, A, B, B, delta_softplus=1), TypeError,
                 r"linrec.selective_scan: delta_softplus must be a bool, got int$", id="ssm-flag"),
    pytest.param(lambda: linrec.selective_scan(U, DELTA, A[:3], B, B), ValueError,
                 r"linrec.selective_scan: A must be 2-dim \(d, n\) with d = 4", id="ssm-shape"),
]


@pytest.mark.parametrize("call, error, message", LAYER_CASES)
def test_every_layer_follows_the_error_convention(call, error, message):
    with pytest.raises(Exception) as raised:
        call()
    assert type(raised.value) is error, f"{type(raised.value).__name__}: {raised.value}"
    assert re.match(message, str(raised.value)), str(raised.value)


@pytest.fixture
def process_group():
    """A group of this process alone, for linrec.distributed's checks."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(coeffs=C.double()), TypeError, r"coeffs must have the dtype of inputs \(torch.float32\), got torch.float64$"),
    (dict(coeffs=[0.5]), TypeError, r"coeffs must be a torch.Tensor or a number, got list$"),
    (dict(dim=2), IndexError, r"dim must be in \[-2, 1\] for a 2-dim tensor, got 2$"),
    (dict(coeffs=torch.rand(3, 4)), ValueError, r"coeffs must be broadcastable to the shape of inputs \[3, 5\]"),
])
def test_distributed_follows_the_error_convention(process_group, kwargs, error, message):
    kwargs = {"inputs": X, "coeffs": C, **kwargs}
    with pytest.raises(Exception) as raised:
        linrec.distributed.linrec(**kwargs)
    assert type(raised.value) is error, f"{type(raised.value).__name__}: {raised.value}"
    assert re.match(r"linrec.distributed.linrec: " + message, str(raised.value)), str(raised.value)


@pytest.mark.parametrize("args, kwargs, error, marker", [
    ((X.long(), C.long()), {}, TypeError, " [TypeError]"),
    ((X, C), dict(dim=2), IndexError, " [IndexError]"),
    ((X, torch.rand(3, 4)), {}, ValueError, "got [3, 4]"),
])
def test_ops_mark_the_conventions_type(args, kwargs, error, marker):
    """Called directly, the C++ ops raise one type (OP_ERRORS); their message ends with the convention's type
    where it is not ValueError, which linrec.linrec raises."""
    with pytest.raises(OP_ERRORS) as raised:
        torch.ops.linrec.forward(*args, **kwargs)
    message = str(raised.value)
    assert message.startswith("linrec.forward: ") and message.rstrip().endswith(marker), message
    assert type(api_error("linrec", raised.value)) is error


def test_a_bad_cpu_isa_is_a_linrec_value_error(monkeypatch):
    monkeypatch.setenv("LINREC_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match=r"^linrec: LINREC_CPU_ISA must be baseline, avx2 or avx512, got 'sse9'$"):
        linrec.linrec(X, C)


# --- scalar arguments as torch takes them --------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "loop"])
def test_numpy_scalars_for_dim_and_flags(backend):
    np = pytest.importorskip("numpy")
    expected = linrec.linrec(X, C.log(), dim=0, reverse=True, log_coeffs=True, backend=backend)
    for dim in (np.int64(0), np.int32(-2), torch.tensor(0)):
        actual = linrec.linrec(X, C.log(), dim=dim, reverse=np.True_, log_coeffs=np.bool_(True), backend=backend)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"^linrec: dim must be an int, got numpy.bool_?$"):
        linrec.linrec(X, C, dim=np.True_, backend=backend)
    with pytest.raises(TypeError, match=r"^linrec: reverse must be a bool, got numpy.int64$"):
        linrec.linrec(X, C, reverse=np.int64(1), backend=backend)


def test_numpy_scalars_in_the_layers(process_group):
    np = pytest.importorskip("numpy")
    torch.testing.assert_close(linrec.rl.discounted_returns(REWARDS.T, np.float32(0.5), dim=np.int64(1)),
                               linrec.rl.discounted_returns(REWARDS.T, 0.5, dim=1))
    y = linrec.linrec(X, C)
    torch.testing.assert_close(linrec.last_states(y, dim=np.int64(0), reverse=np.True_), y[0])
    scanned = linrec.selective_scan(U, DELTA, A, B, B, delta_softplus=np.True_, return_last_state=np.True_)
    assert isinstance(scanned, tuple)
    assert linrec.nn.MinGRU(np.int64(5), np.int32(4)).hidden_size == 4
    torch.testing.assert_close(linrec.distributed.linrec(X, 0.5, dim=np.int64(0), reverse=np.True_),
                               linrec.linrec(X, torch.tensor(0.5), dim=0, reverse=True))


@pytest.mark.parametrize("backend", ["auto", "loop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64])
def test_a_number_is_a_0_dim_coeffs(backend, dtype):
    """In inputs' dtype, float32 for 16-bit inputs (a decay of 0.999 is 1.0 in bfloat16); a complex number for
    complex inputs."""
    inputs = X.to(dtype)
    number = 0.999 + 0.01j if dtype.is_complex else 0.999
    coeffs_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    expected = linrec.linrec(inputs, torch.tensor(number, dtype=coeffs_dtype), backend=backend)
    torch.testing.assert_close(linrec.linrec(inputs, number, backend=backend), expected, rtol=0, atol=0)
    if not dtype.is_complex:
        expected = linrec.linrec(inputs, torch.tensor(-0.5, dtype=coeffs_dtype), log_coeffs=True, backend=backend)
        torch.testing.assert_close(linrec.linrec(inputs, -0.5, log_coeffs=True, backend=backend), expected, rtol=0, atol=0)


# --- public names ---------------------------------------------------------------------------------------


def test_dir_lists_the_public_names():
    public = {name for name in dir(linrec) if not name.startswith("__")}
    assert public == set(linrec.__all__) - {"__version__"}
    assert all(hasattr(linrec, name) for name in linrec.__all__)
    assert not {"scan", "reference", "_core", "COMPILED", "TRITON", "check_arguments"} & set(dir(linrec))
