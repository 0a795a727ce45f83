"""The model-facing features, forward and backward against autograd through the float64 loop and by
gradcheck: any time dim and strided views, broadcast coefficients, initial states (chunked equals
unchunked), packed sequences (cu_seqlens), log coefficients and complex numbers."""

from __future__ import annotations

import pytest
import torch
from helpers import (
    DTYPES,
    REAL_DTYPES,
    assert_matches,
    check_against_reference,
    random_coeffs,
    random_values,
    strided_view,
)

import linrec


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_dim_and_strided_views(device, seed, dtype, dim, kind):
    shape = (3, 37, 5)
    inputs = strided_view(shape, dtype, device, kind)
    coeffs = strided_view(shape, dtype, device, "transposed" if kind == "sliced" else kind, random_coeffs)
    for reverse in (False, True):
        check_against_reference(inputs.detach(), coeffs.detach(), dtype, dim=dim, reverse=reverse)


def test_outputs_keep_the_layout_of_dense_inputs(device, seed):
    inputs = random_values((4, 6, 50), torch.float32, device).transpose(1, 2)  # (4, 50, 6), time contiguous
    outputs = linrec.linrec(inputs, random_coeffs(inputs.shape, torch.float32, device), dim=1)
    assert outputs.stride() == inputs.stride()


# (inputs shape, dim, coeffs shape): the layouts models use.
BROADCASTS = [
    ((2, 41, 6), 1, ()),  # one scalar decay
    ((2, 41, 6), 1, (6,)),  # per-channel time-invariant filter (S4, EMA), (batch, time, channels)
    ((2, 41, 6), 1, (2, 41, 1)),  # one coefficient per (batch, time) shared by channels (Mamba-2 heads)
    ((2, 6, 41), -1, (6, 1)),  # per-channel constant, time last
    ((2, 6, 41), -1, (2, 1, 41)),  # per (batch, time), time last
    ((3, 41), 0, (41,)),  # per row, time first
    ((2, 3, 41, 4), 2, (3, 1, 4)),  # per (head, channel)
]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape, dim, coeffs_shape", BROADCASTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
def test_broadcast_coeffs(device, seed, dtype, shape, dim, coeffs_shape, reverse):
    inputs = random_values(shape, dtype, device)
    # |c| <= 0.9: a coefficient shared by a whole row (or tensor) near 1 would carry the rounding of
    # every step over the full length, past a tolerance meant for recurrences that forget.
    coeffs = random_coeffs(coeffs_shape, dtype, device) * 0.9
    check_against_reference(inputs, coeffs, dtype, dim=dim, reverse=reverse)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_initial_state(device, seed, dtype, dim, reverse):
    inputs = random_values((3, 29, 4), dtype, device)
    coeffs = random_coeffs((3, 29, 4), dtype, device)
    initial_shape = [size for d, size in enumerate(inputs.shape) if d != dim % 3]
    check_against_reference(inputs, coeffs, dtype, dim=dim, reverse=reverse, initial=random_values(initial_shape, dtype, device))


def test_initial_state_formula(device):
    inputs = torch.tensor([[1.0, 2.0, 3.0]], device=device)
    coeffs = torch.tensor([[0.5, 2.0, -1.0]], device=device)
    initial = torch.tensor([4.0], device=device)
    # y0 = 0.5 * 4 + 1 = 3, y1 = 2 * 3 + 2 = 8, y2 = -8 + 3 = -5; reverse: y2 = -4 + 3 = -1, y1 = -2 + 2 = 0, y0 = 1
    assert linrec.linrec(inputs, coeffs, initial=initial).tolist() == [[3.0, 8.0, -5.0]]
    assert linrec.linrec(inputs, coeffs, initial=initial, reverse=True).tolist() == [[1.0, 0.0, -1.0]]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.complex128], ids=str)
def test_chunked_equals_unchunked(device, seed, dtype, reverse):
    """A long sequence in chunks, each starting from the previous chunk's final state: outputs and
    gradients equal those of one call over the whole sequence (training with truncated chunks,
    streaming inference)."""
    inputs = random_values((2, 100, 3), dtype, device, requires_grad=True)
    coeffs = random_coeffs((2, 100, 3), dtype, device, requires_grad=True)
    initial = random_values((2, 3), dtype, device, requires_grad=True)
    whole = linrec.linrec(inputs, coeffs, dim=1, reverse=reverse, initial=initial)

    bounds = [0, 1, 30, 31, 64, 100]
    chunks = list(zip(bounds, bounds[1:]))
    if reverse:
        chunks.reverse()  # a reverse scan streams from the end
    state, pieces = initial, {}
    for begin, end in chunks:
        piece = linrec.linrec(inputs[:, begin:end], coeffs[:, begin:end], dim=1, reverse=reverse, initial=state)
        state = piece.select(1, 0 if reverse else -1)  # the final state, in scan order
        pieces[begin] = piece
    chunked = torch.cat([pieces[begin] for begin in sorted(pieces)], dim=1)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)

    d_outputs = random_values(whole.shape, dtype, device)
    expected = torch.autograd.grad(whole, (inputs, coeffs, initial), d_outputs)
    actual = torch.autograd.grad(chunked, (inputs, coeffs, initial), d_outputs)
    for grad, want in zip(actual, expected):
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_initial", [False, True])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_sequences(device, seed, dtype, offsets_dtype, with_initial, reverse):
    lengths = [5, 1, 0, 33, 2, 17]  # an empty sequence too
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=offsets_dtype, device=device)
    total = sum(lengths)
    for shape, dim in (((1, total, 3), 1), ((1, 3, total), 2)):
        inputs = random_values(shape, dtype, device)
        coeffs = random_coeffs(shape, dtype, device)
        initial = None
        if with_initial:
            initial_shape = [len(lengths)] + [size for d, size in enumerate(shape) if d not in (0, dim)]
            initial = random_values(initial_shape, dtype, device)
        check_against_reference(inputs, coeffs, dtype, dim=dim, reverse=reverse, initial=initial, cu_seqlens=offsets)


@pytest.mark.parametrize("reverse", [False, True])
def test_no_gradient_crosses_a_packed_boundary(device, seed, reverse):
    offsets = torch.tensor([0, 10, 25], device=device)
    inputs = random_values((1, 25, 2), torch.float64, device, requires_grad=True)
    coeffs = random_coeffs((1, 25, 2), torch.float64, device, requires_grad=True)
    outputs = linrec.linrec(inputs, coeffs, dim=1, reverse=reverse, cu_seqlens=offsets)
    later, earlier = (slice(0, 10), slice(10, 25)) if reverse else (slice(10, 25), slice(0, 10))
    d_inputs, d_coeffs = torch.autograd.grad(outputs[:, later].sum(), (inputs, coeffs))
    assert (d_inputs[:, earlier] == 0).all() and (d_coeffs[:, earlier] == 0).all()
    assert (d_inputs[:, later] != 0).all()
    # The first coefficient of each sequence takes no part either.
    first = 9 if reverse else 10
    assert (d_coeffs[:, first] == 0).all()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_log_coeffs(device, seed, dtype, reverse):
    inputs = random_values((3, 45), dtype, device)
    log_coeffs = (-4 * torch.rand(3, 45, dtype=torch.float64)).to(dtype).to(device)  # c in (e^-4, 1)
    check_against_reference(inputs, log_coeffs, dtype, reverse=reverse, log_coeffs=True)
    # the same as passing the coefficients themselves
    expected = linrec.linrec(inputs.double(), log_coeffs.double().exp(), reverse=reverse)
    assert_matches(linrec.linrec(inputs, log_coeffs, reverse=reverse, log_coeffs=True), expected.cpu(), dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_every_feature(device, seed, reverse):
    """Strided time dim, broadcast coeffs, initial state and packed sequences together, in complex128,
    and with log coefficients in float64."""
    offsets = torch.tensor([0, 4, 5, 11], device=device)
    inputs = random_values((1, 11, 3), torch.complex128, device, requires_grad=True)
    coeffs = random_coeffs((11, 1), torch.complex128, device, requires_grad=True)
    initial = random_values((3, 3), torch.complex128, device, requires_grad=True)
    function = lambda x, c, h: linrec.linrec(x, c, dim=1, reverse=reverse, initial=h, cu_seqlens=offsets)  # noqa: E731
    assert torch.autograd.gradcheck(function, (inputs, coeffs, initial))

    inputs = random_values((4, 3, 9), torch.float64, device, requires_grad=True)
    log_coeffs = (-torch.rand(3, 1, dtype=torch.float64, device=device)).requires_grad_()
    initial = random_values((3, 9), torch.float64, device, requires_grad=True)
    function = lambda x, c, h: linrec.linrec(x, c, dim=0, reverse=reverse, initial=h, log_coeffs=True)  # noqa: E731
    assert torch.autograd.gradcheck(function, (inputs, log_coeffs, initial))


def test_no_operand_is_copied_or_expanded():
    """The kernels read strided and broadcast operands in place: the profiler sees no copy, expand or
    contiguous in forward and backward (only the sum of a broadcast coefficient's gradient)."""
    inputs = random_values((4, 8, 64), torch.float32).transpose(1, 2).requires_grad_()  # (4, 64, 8), dim=1
    coeffs = random_coeffs((8,), torch.float32, requires_grad=True)
    initial = random_values((8, 4), torch.float32).t().requires_grad_()
    with torch.profiler.profile() as profile:
        outputs = linrec.linrec(inputs, coeffs, dim=1, initial=initial)
        torch.autograd.grad(outputs, (inputs, coeffs, initial), torch.ones_like(outputs))
    names = {event.name for event in profile.events()}
    assert "linrec::forward" in names and "linrec::backward" in names
    copies = {name for name in names if any(word in name for word in ("copy", "contiguous", "expand", "clone"))}
    assert not copies, copies
