"""linrec.causal_conv1d and causal_conv1d_update against a float64 loop over steps and sequences: outputs, final
states and every gradient; packed sequences that never see each other; the decode step against the whole
convolution; the errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import TOLERANCE, assert_matches, random_values, wide

import linrec

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def loop_conv(x, weight, bias=None, activation=None, initial_states=None, cu_seqlens=None):
    """The convolution sequence by sequence in float64: (out, final states), each sequence from its own start,
    each step the sum of its window of width inputs times the taps."""
    x, weight, bias, initial_states = (wide(t) if t is not None and not t.requires_grad else t
                                       for t in (x, weight, bias, initial_states))
    batch, dim, length = x.shape
    width = weight.shape[1]
    bounds = [(row, 0, length) for row in range(batch)] if cu_seqlens is None else [
        (0, start, end) for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    pieces = {row: [] for row in range(batch)}
    finals = []
    for sequence, (row, start, end) in enumerate(bounds):
        history = (torch.zeros(dim, width - 1, dtype=x.dtype) if initial_states is None
                   else initial_states[sequence])
        steps = torch.cat([history, x[row, :, start:end]], dim=-1)
        value = (steps.unfold(-1, width, 1) * weight.unsqueeze(1)).sum(-1) if end > start else \
            steps.new_zeros(dim, 0)  # (dim, end - start)
        if bias is not None:
            value = value + bias.unsqueeze(-1)
        pieces[row].append(F.silu(value) if activation else value)
        finals.append(steps[:, steps.shape[1] - (width - 1):])
    out = torch.stack([torch.cat(pieces[row], -1) if pieces[row] else x.new_zeros(dim, 0) for row in range(batch)]) \
        if batch else x.new_zeros(0, dim, length)
    return out, torch.stack(finals) if finals else torch.zeros(0, dim, width - 1, dtype=x.dtype)


def check(x, weight, bias=None, activation=None, initial_states=None, cu_seqlens=None):
    """Outputs, final states and the gradients of every tensor argument against the loop."""
    leaves = {name: t.requires_grad_() for name, t in dict(x=x, weight=weight, bias=bias,
                                                           initial_states=initial_states).items() if t is not None}
    offsets = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=x.device)
    out, final = linrec.causal_conv1d(x, weight, bias, activation, initial_states, offsets, return_final_states=True)
    assert out.shape == x.shape and out.dtype == x.dtype and final.dtype == x.dtype
    wide_leaves = {name: wide(t).requires_grad_() for name, t in leaves.items()}
    expected_out, expected_final = loop_conv(**wide_leaves, activation=activation, cu_seqlens=cu_seqlens)
    assert_matches(out, expected_out, x.dtype, "out")
    assert_matches(final, expected_final, x.dtype, "final states")
    d_out, d_final = random_values(out.shape, out.dtype, x.device), random_values(final.shape, final.dtype, x.device)
    grads = torch.autograd.grad((out, final), list(leaves.values()), (d_out, d_final), materialize_grads=True)
    expected = torch.autograd.grad((expected_out, expected_final), list(wide_leaves.values()),
                                   (wide(d_out), wide(d_final)), materialize_grads=True, allow_unused=True)
    steps = x.shape[0] * x.shape[-1]
    for (name, leaf), grad, want in zip(leaves.items(), grads, expected):
        assert grad.shape == leaf.shape and grad.dtype == leaf.dtype, name
        summed = name in ("weight", "bias")  # a term a step
        assert_matches(grad, torch.zeros_like(grad, dtype=torch.float64) if want is None else want, leaf.dtype,
                       f"d_{name}", terms=steps if summed else 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5])
def test_against_the_loop(device, seed, dtype, width):
    x = random_values((2, 6, 37), dtype, device)
    weight = random_values((6, width), torch.float32 if dtype != torch.float64 else dtype, device)
    bias = random_values((6,), weight.dtype, device)
    initial = random_values((2, 6, width - 1), dtype, device)
    check(x, weight, bias, "silu", initial)
    check(x.detach(), weight.detach(), None, None, None)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_packed_sequences(device, seed, width):
    """Empty sequences, ones shorter than the kernel and long ones, with and without starting values."""
    cu_seqlens = [0, 0, 1, 3, 3, 20, 21, 40]
    x = random_values((1, 5, 40), torch.float64, device)
    weight = random_values((5, width), torch.float64, device)
    initial = random_values((len(cu_seqlens) - 1, 5, width - 1), torch.float64, device)
    check(x, weight, random_values((5,), torch.float64, device), "swish", initial, cu_seqlens)
    check(x.detach(), weight.detach(), None, None, None, cu_seqlens)


def laid_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """values (batch, dim, length) as a time-last tensor, the first dim channels of a (batch, 2 dim, length)
    one (how mamba_ssm slices its projection), a channel-last one ((batch, length, dim) transposed), or the first
    dim channels of a (batch, length, 2 dim) tensor transposed (how transformers slices its projection)."""
    if layout == "time-last":
        return values.clone()
    if layout == "time-slice":
        return torch.cat([values, torch.full_like(values, float("nan"))], 1)[:, : values.shape[1]]
    if layout == "channel-last":
        return values.transpose(1, 2).contiguous().transpose(1, 2)
    dim = values.shape[1]
    wider = torch.cat([values.transpose(1, 2), torch.full_like(values.transpose(1, 2), float("nan"))], -1)
    return wider.contiguous()[..., :dim].transpose(1, 2)


@pytest.mark.parametrize("layout", ["time-last", "time-slice", "channel-last", "channel-slice"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("length", [2048, 2049, 3001])
def test_long_rows(device, seed, dtype, length, layout):
    """Rows of several of the kernels' tiles (1024 steps of 16-bit values a block, 512 of float32, 256 of
    float64; channel-last blocks of 128 steps), whole and odd (a time-last row not 16-byte aligned), in every
    layout, 16 channels (vectors of channels) and 3, and packed sequences whose boundaries fall inside a
    thread's steps, on a thread's edge and on a block's."""
    cu_seqlens = [0, 7, 8, 9, 255, 256, 511, 512, 1024, 1025, 1500, length]
    for dim in (16, 3):
        weight = random_values((dim, 4), torch.float32 if dtype != torch.float64 else dtype, device)
        bias = random_values((dim,), weight.dtype, device)
        check(laid_out(random_values((2, dim, length), dtype, device), layout), weight, bias, "silu",
              random_values((2, dim, 3), dtype, device))
        check(laid_out(random_values((1, dim, length), dtype, device), layout), weight.detach(), bias.detach(),
              "silu", random_values((len(cu_seqlens) - 1, dim, 3), dtype, device), cu_seqlens)


def test_second_derivative(device, seed):
    """A graph of the backward (create_graph) differentiates again: gradgradcheck in float64."""
    x = random_values((2, 3, 41), torch.float64, device).requires_grad_()
    weight = random_values((3, 4), torch.float64, device).requires_grad_()
    bias = random_values((3,), torch.float64, device).requires_grad_()
    initial = random_values((2, 3, 3), torch.float64, device).requires_grad_()
    torch.autograd.gradgradcheck(lambda *args: linrec.causal_conv1d(*args[:3], "silu", args[3],
                                                                    return_final_states=True),
                                 (x, weight, bias, initial))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not linrec.HAS_CUDA_KERNELS, reason="needs linrec's CUDA kernels")
def test_gpu_calls_take_the_kernels(monkeypatch, seed):
    """On the GPU, widths 1 to 4 run on the CUDA ops (forward, backward and decode step); width 5 composes."""
    from linrec._core import causal_conv

    calls = []
    for name in ("_FORWARD", "_BACKWARD", "_UPDATE"):
        op = getattr(causal_conv, name)
        monkeypatch.setattr(causal_conv, name, lambda *args, _op=op, _name=name: calls.append(_name) or _op(*args))
    for width in (1, 4, 5):
        calls.clear()
        x = random_values((2, 3, 20), torch.float32, "cuda").requires_grad_()
        weight = random_values((3, width), torch.float32, "cuda")
        linrec.causal_conv1d(x, weight, activation="silu").sum().backward()
        linrec.causal_conv1d_update(x.detach()[..., 0], torch.zeros(2, 3, max(width - 1, 1), device="cuda"), weight)
        assert calls == ([] if width > 4 else ["_FORWARD", "_BACKWARD", "_UPDATE"]), width


def test_packed_sequences_never_see_each_other(device, seed):
    """Changing one sequence's inputs changes no other sequence's outputs or final state, bit for bit."""
    offsets = torch.tensor([0, 5, 6, 30, 64], device=device)
    x = random_values((1, 8, 64), torch.float32, device)
    weight = random_values((8, 4), torch.float32, device)
    out, final = linrec.causal_conv1d(x, weight, cu_seqlens=offsets, return_final_states=True)
    changed = x.clone()
    changed[..., 6:30] = 1e6
    out_changed, final_changed = linrec.causal_conv1d(changed, weight, cu_seqlens=offsets, return_final_states=True)
    outside = torch.ones(64, dtype=torch.bool, device=device)
    outside[6:30] = False
    assert torch.equal(out[..., outside], out_changed[..., outside])
    assert torch.equal(final[[0, 1, 3]], final_changed[[0, 1, 3]]) and not torch.equal(final[2], final_changed[2])


def test_chunks_continue_from_final_states(device, seed):
    x = random_values((3, 4, 50), torch.float64, device)
    weight = random_values((4, 4), torch.float64, device)
    whole = linrec.causal_conv1d(x, weight, activation="silu")
    first, state = linrec.causal_conv1d(x[..., :2], weight, activation="silu", return_final_states=True)
    second, state = linrec.causal_conv1d(x[..., 2:30], weight, activation="silu", initial_states=state,
                                         return_final_states=True)
    third = linrec.causal_conv1d(x[..., 30:], weight, activation="silu", initial_states=state)
    torch.testing.assert_close(torch.cat([first, second, third], -1), whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("state_len", [3, 6])
def test_update_steps_follow_the_convolution(device, seed, dtype, state_len):
    """One step at a time, and several at once, from the final states: the convolution's outputs, and the
    state ends holding the latest inputs (a longer buffer shifted as a whole)."""
    x = random_values((2, 5, 12), dtype, device)
    weight, bias = random_values((5, 4), torch.float32, device), random_values((5,), torch.float32, device)
    whole = linrec.causal_conv1d(x, weight, bias, "silu")
    history = random_values((2, 5, state_len), dtype, device)
    history[..., state_len - 3:] = linrec.causal_conv1d(x[..., :4], weight, return_final_states=True)[1]
    state = history.clone()
    for t in range(4, 8):
        out = linrec.causal_conv1d_update(x[..., t], state, weight, bias, "silu")
        assert out.shape == (2, 5) and out.dtype == dtype
        assert_matches(out, wide(whole[..., t]), dtype, f"step {t}")
    out = linrec.causal_conv1d_update(x[..., 8:], state, weight, bias, "silu")
    assert_matches(out, wide(whole[..., 8:]), dtype, "steps 8-11")
    expected_state = torch.cat([history, x[..., 4:]], -1)[..., -state_len:]
    assert torch.equal(state, expected_state)


def test_update_with_state_indices(device, seed):
    """Continuous batching: each batch row reads and writes its own row of the cache; a negative index is a
    padded row, computed from zeros, whose state is not written."""
    weight = random_values((3, 4), torch.float32, device)
    cache = random_values((5, 3, 3), torch.float32, device)
    x = random_values((3, 3), torch.float32, device)
    indices = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    before = cache.clone()
    out = linrec.causal_conv1d_update(x, cache, weight, conv_state_indices=indices)
    for row, slot in ((0, 4), (2, 1)):
        own = before[slot : slot + 1].clone()
        torch.testing.assert_close(out[row : row + 1], linrec.causal_conv1d_update(x[row : row + 1], own, weight))
        assert torch.equal(cache[slot], own[0])
    zeros = torch.zeros(1, 3, 3, device=device)
    torch.testing.assert_close(out[1:2], linrec.causal_conv1d_update(x[1:2], zeros, weight))
    assert torch.equal(cache[[0, 2, 3]], before[[0, 2, 3]])


def test_empty_dims(device):
    weight = torch.randn(4, 3, device=device, requires_grad=True)
    for shape in ((0, 4, 5), (2, 4, 0)):
        x = torch.randn(shape, device=device, requires_grad=True)
        out, final = linrec.causal_conv1d(x, weight, return_final_states=True)
        assert out.shape == shape and final.shape == (shape[0], 4, 2)
        grads = torch.autograd.grad(out.sum() + final.sum(), (x, weight), allow_unused=True, materialize_grads=True)
        assert grads[0].shape == shape and not grads[1].any()
    out = linrec.causal_conv1d(torch.randn(2, 0, 5, device=device), torch.randn(0, 3, device=device))
    assert out.shape == (2, 0, 5)


def test_autocast_keeps_float32(device, seed):
    """Under autocast the convolution still computes in float32 (not the autocast dtype)."""
    x = random_values((2, 4, 33), torch.float32, device)
    weight = random_values((4, 4), torch.float32, device)
    expected = linrec.causal_conv1d(x, weight)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = linrec.causal_conv1d(x, weight)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


X, W = torch.zeros(2, 4, 8), torch.zeros(4, 3)


@pytest.mark.parametrize("call, error, message", [
    (lambda: linrec.causal_conv1d(X[0], W), ValueError, r"x must be \(batch, dim, length\), got shape \[4, 8\]"),
    (lambda: linrec.causal_conv1d(X.long(), W), TypeError, "x must be a real floating-point tensor, got torch.int64"),
    (lambda: linrec.causal_conv1d(X, W[:3]), ValueError, r"weight must be \(dim, width\) with dim = 4 .* got shape \[3, 3\]"),
    (lambda: linrec.causal_conv1d(X, W, torch.zeros(3)), ValueError, r"bias must have shape \(dim,\) = \[4\], got \[3\]"),
    (lambda: linrec.causal_conv1d(X, W, activation="relu"), ValueError, "activation must be None, 'silu' or 'swish', got 'relu'"),
    (lambda: linrec.causal_conv1d(X, W, initial_states=torch.zeros(2, 4, 3)), ValueError,
     r"initial_states must have shape \(batch, dim, width - 1\) = \[2, 4, 2\], got \[2, 4, 3\]"),
    (lambda: linrec.causal_conv1d(X, W, cu_seqlens=torch.tensor([0, 8])), ValueError, "with cu_seqlens, x must hold"),
    (lambda: linrec.causal_conv1d(X[:1], W, cu_seqlens=torch.tensor([0, 9])), ValueError, "cu_seqlens must end at"),
    (lambda: linrec.causal_conv1d(X, [1.0]), TypeError, "weight must be a torch.Tensor, got list"),
    (lambda: linrec.causal_conv1d_update(X[0, 0], torch.zeros(2, 4, 2), W), ValueError,
     r"x must be \(batch, dim\) or \(batch, dim, steps\), got shape \[8\]"),
    (lambda: linrec.causal_conv1d_update(X, torch.zeros(2, 4, 1), W), ValueError,
     r"conv_state must be \(batch, dim, state_len\) with dim = 4 and state_len >= width - 1 = 2, batch = 2"),
    (lambda: linrec.causal_conv1d_update(X[..., 0], torch.zeros(3, 4, 2), W,
                                         conv_state_indices=torch.tensor([0, 3])), ValueError,
     "conv_state_indices must be below conv_state's 3 rows"),
    (lambda: linrec.causal_conv1d_update(X[..., 0], torch.zeros(3, 4, 2), W,
                                         conv_state_indices=torch.tensor([1, 1])), ValueError,
     r"conv_state_indices must be distinct \(each conv_state row is updated by one batch row\), got \[1, 1\]"),
    (lambda: linrec.causal_conv1d_update(X[..., 0], torch.zeros(3, 4, 2), W,
                                         conv_state_indices=torch.tensor([0.0, 1.0])), TypeError,
     "conv_state_indices must be torch.int32 or torch.int64, got torch.float32"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_compiles_fullgraph_with_dynamic_lengths(device, seed):
    """torch.compile(fullgraph=True) traces the packed convolution with its final states, and the compiled
    function serves another length and other offsets."""
    weight = random_values((8, 4), torch.float32, device)
    compiled = torch.compile(lambda x, o: linrec.causal_conv1d(x, weight, None, "silu", cu_seqlens=o,
                                                               return_final_states=True), fullgraph=True, dynamic=True,
                             backend="aot_eager")  # traced whole; inductor's code generation is not the point
    for length, offsets in ((40, [0, 5, 17, 40]), (57, [0, 20, 57])):
        x = random_values((1, 8, length), torch.float32, device)
        offsets = torch.tensor(offsets, device=device)
        for got, want in zip(compiled(x, offsets), linrec.causal_conv1d(x, weight, None, "silu", cu_seqlens=offsets,
                                                                       return_final_states=True)):
            torch.testing.assert_close(got, want)


def test_update_with_state_indices_compiles(device, seed):
    """The decode step with padded batch rows traces whole (no shape depends on the indices) and writes as the
    eager step does; a batch of padded rows only leaves the cache as it was."""
    weight = random_values((3, 4), torch.float32, device)
    step = torch.compile(linrec.causal_conv1d_update, fullgraph=True, backend="aot_eager")
    for indices in ([4, -1, 0], [-1, 2, -1], [-1, -1, -1], [1, 7, 3]):  # 7: past the rows, padded when compiled
        cache = random_values((5, 3, 3), torch.float32, device)
        x = random_values((3, 3), torch.float32, device)
        indices = torch.tensor(indices, device=device)
        eager_cache = cache.clone()
        eager_indices = torch.where(indices < 5, indices, -1)
        expected = linrec.causal_conv1d_update(x, eager_cache, weight, conv_state_indices=eager_indices)
        before = cache.clone()
        torch.testing.assert_close(step(x, cache, weight, conv_state_indices=indices), expected)
        assert torch.equal(cache, eager_cache)
        if (indices < 0).all():
            assert torch.equal(cache, before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not linrec.HAS_CUDA_KERNELS, reason="needs linrec's CUDA kernels")
@pytest.mark.parametrize("layout", ["time-last", "time-slice", "channel-last"])
def test_opcheck(seed, layout):
    """torch.library.opcheck on the CUDA ops: schemas, fake kernels, the forward's autograd, the decode step's
    in-place write."""
    x = laid_out(random_values((2, 8, 45), torch.float32, "cuda"), layout).requires_grad_()
    weight = random_values((8, 4), torch.float32, "cuda").requires_grad_()
    bias = random_values((8,), torch.float32, "cuda").requires_grad_()
    initial = random_values((2, 8, 3), torch.float32, "cuda").requires_grad_()
    torch.library.opcheck(torch.ops.linrec.causal_conv1d_forward.default, (x, weight, bias, True, initial, None, True))
    packed = random_values((1, 8, 45), torch.float32, "cuda")
    offsets = torch.tensor([0, 2, 30, 45], device="cuda", dtype=torch.int32)
    torch.library.opcheck(torch.ops.linrec.causal_conv1d_forward.default,
                          (packed, weight.detach(), None, False, None, offsets, True))
    state = random_values((3, 8, 5), torch.float32, "cuda")
    indices = torch.tensor([2, -1], device="cuda")
    torch.library.opcheck(torch.ops.linrec.causal_conv1d_update.default,
                          (state, random_values((2, 8, 2), torch.float32, "cuda"), weight.detach(), None, True, indices))
