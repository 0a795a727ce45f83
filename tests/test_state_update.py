"""linrec.selective_state_update (the decode step): T steps against one linrec.selective_scan call of T steps,
bit for bit where the scan walks time step by step (the CPU; the GPU's lane kernels), Mamba-2's heads layout
against the same step in Mamba-1's, state rows picked by state_batch_indices (padded rows too), 16-bit and
strided states, the float64 loop, and the errors bad arguments raise."""

from __future__ import annotations

import doctest

import pytest
import torch
from helpers import assert_matches, random_values, wide
from test_selective_scan import loop_reference

import linrec
import linrec.state_update


def make_step_arguments(device, dtype, batch, d, n, length, groups=None, complex_A=False):
    """Random per-step operands of `length` steps (time last) and the per-channel ones, as a decode loop takes
    them: u, delta, z, B and C in ``dtype``; A, D and delta_bias in float32 (float64 beside float64)."""
    param = torch.float64 if dtype == torch.float64 else torch.float32
    A = -(0.5 + torch.rand(d, n, dtype=param, device=device))
    if complex_A:
        A = torch.complex(A, 3 * torch.randn(d, n, dtype=param, device=device))
    projection_shape = (batch, n, length) if groups is None else (batch, groups, n, length)
    projection_dtype = A.dtype if complex_A else dtype
    return dict(
        u=random_values((batch, d, length), dtype, device),
        delta=(-1 + 0.5 * torch.randn(batch, d, length, device=device)).to(dtype),
        A=A,
        B=random_values(projection_shape, projection_dtype, device),
        C=random_values(projection_shape, projection_dtype, device),
        D=random_values((d,), param, device),
        z=random_values((batch, d, length), dtype, device),
        delta_bias=0.3 * random_values((d,), param, device),
    )


def run_steps(state, arguments, length):
    """The outputs of `length` decode steps from ``state`` (updated in place), stacked along the last dim."""
    outs = []
    for t in range(length):
        outs.append(linrec.selective_state_update(
            state, arguments["u"][..., t], arguments["delta"][..., t], arguments["A"], arguments["B"][..., t],
            arguments["C"][..., t], arguments["D"], arguments["z"][..., t], arguments["delta_bias"], True))
    return torch.stack(outs, dim=-1)


def runs_step_by_step(device, dtype, n, complex_A):
    """Whether the fused scan walks time step by step: always on the CPU; on the GPU, in its lane kernels
    (a real float32 state, n <= 128, B and C varying with the same groups)."""
    return device == "cpu" or (dtype != torch.float64 and n <= 128 and not complex_A)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("n", [1, 3, 5, 8, 16, 17, 64, 100])
@pytest.mark.parametrize("groups", [None, 2])
def test_steps_give_the_scans_bits(device, seed, dtype, n, groups):
    """T steps from a state: the outputs and last state of one selective_scan call of the T steps from it,
    bit for bit where the scan walks time step by step; 300 steps of 64 channels and on the GPU 20 of
    8 x 2048 (the scan's plan takes other policies than a step's: lanes of one state dim at n <= 4 for the
    second), and 37 of 6."""
    for batch, d, length in ((2, 6, 37), (2, 64, 300)) + (((8, 2048, 20),) if device == "cuda" else ()):
        arguments = make_step_arguments(device, dtype, batch, d, n, length, groups)
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        initial = random_values((batch, d, n), state_dtype, device)
        out, last_state = linrec.selective_scan(**arguments, delta_softplus=True, return_last_state=True,
                                                initial=initial)
        state = initial.clone()
        steps = run_steps(state, arguments, length)
        assert steps.dtype == out.dtype and steps.shape == out.shape
        if runs_step_by_step(device, dtype, n, False):
            assert torch.equal(steps, out), f"outputs differ by {(steps - out).abs().max().item()}"
            assert torch.equal(state, last_state), f"states differ by {(state - last_state).abs().max().item()}"
        else:
            assert_matches(steps, out.cpu(), dtype, "out")
            assert_matches(state, last_state.cpu(), state_dtype, "state")


def test_complex_steps(device, seed):
    """A complex A: the state is complex, B and C complex (or real, taken as complex); steps against the scan."""
    batch, d, n, length = 2, 4, 3, 21
    arguments = make_step_arguments(device, torch.float32, batch, d, n, length, complex_A=True)
    initial = random_values((batch, d, n), torch.complex64, device)
    out, last_state = linrec.selective_scan(**arguments, delta_softplus=True, return_last_state=True, initial=initial)
    state = initial.clone()
    steps = run_steps(state, arguments, length)
    if runs_step_by_step(device, torch.float32, n, True):
        assert torch.equal(steps, out) and torch.equal(state, last_state)
    else:
        assert_matches(steps, out.cpu(), torch.float32, "out")
        assert_matches(state, last_state.cpu(), torch.complex64, "state")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_step_against_the_loop(device, seed, dtype):
    """One step of each layout against Mamba's equations in float64."""
    batch, d, n = 3, 8, 5
    arguments = make_step_arguments(device, dtype, batch, d, n, 1, groups=2)
    initial = random_values((batch, d, n), torch.float32, device)
    expected_out, expected_state = loop_reference(**{name: wide(tensor) for name, tensor in arguments.items()},
                                                  delta_softplus=True, initial=wide(initial))
    state = initial.clone()
    out = run_steps(state, arguments, 1)
    assert_matches(out, expected_out, dtype, "out")
    assert_matches(state, expected_state, torch.float32, "state")


def test_heads_layout(device, seed):
    """Mamba-2's layout (batch, heads, head_dim, n), A a scalar per head expanded as Mamba-2 passes it, B and C
    per group of heads: the same bits as the step over the flattened channels in Mamba-1's layout."""
    batch, heads, head_dim, n, groups = 2, 4, 3, 8, 2
    d = heads * head_dim
    state = random_values((batch, heads, head_dim, n), torch.float32, device)
    x, dt, z = (random_values((batch, heads, head_dim), torch.bfloat16, device) for _ in range(3))
    A = -torch.rand(heads, 1, 1, device=device).expand(heads, head_dim, n)
    B, C = (random_values((batch, groups, n), torch.bfloat16, device) for _ in range(2))
    D = random_values((heads, 1), torch.float32, device).expand(heads, head_dim)
    dt_bias = random_values((heads, head_dim), torch.float32, device)
    flat_state = state.reshape(batch, d, n).clone()
    out = linrec.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    flat_out = linrec.selective_state_update(flat_state, x.reshape(batch, d), dt.reshape(batch, d),
                                             A.reshape(d, n), B, C, D.reshape(d), z.reshape(batch, d),
                                             dt_bias.reshape(d), True)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out.reshape(batch, d), flat_out)
    assert torch.equal(state.reshape(batch, d, n), flat_state)


def test_state_batch_indices(device, seed):
    """Each batch row reads and writes the state row its index names; rows no index names keep their bits; a
    padded row (negative index) starts from zeros and writes nothing."""
    batch, slots, d, n = 3, 5, 6, 4
    arguments = make_step_arguments(device, torch.float32, batch, d, n, 1)
    cache = random_values((slots, d, n), torch.float32, device)
    indices = torch.tensor([3, -1, 0], device=device, dtype=torch.int32)
    before = cache.clone()
    out = run_steps_with_indices(cache, arguments, indices)

    rows = before[[3, 0, 0]].clone()
    rows[1] = 0  # the padded row's state
    expected = run_steps(rows, arguments, 1)[..., 0]
    assert torch.equal(out, expected)
    assert torch.equal(cache[3], rows[0]) and torch.equal(cache[0], rows[2])
    for untouched in (1, 2, 4):
        assert torch.equal(cache[untouched], before[untouched])


def run_steps_with_indices(cache, arguments, indices):
    return linrec.selective_state_update(
        cache, arguments["u"][..., 0], arguments["delta"][..., 0], arguments["A"], arguments["B"][..., 0],
        arguments["C"][..., 0], arguments["D"], arguments["z"][..., 0], arguments["delta_bias"], True,
        state_batch_indices=indices)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_state(device, seed, state_dtype):
    """A 16-bit state is read as float32 and written back rounded: the float32 state's step, rounded."""
    batch, d, n = 2, 6, 4
    arguments = make_step_arguments(device, torch.bfloat16, batch, d, n, 1)
    state = random_values((batch, d, n), state_dtype, device)
    reference = state.float()
    out = run_steps(state, arguments, 1)
    expected = run_steps(reference, arguments, 1)
    assert state.dtype == state_dtype
    assert torch.equal(out, expected)
    assert torch.equal(state, reference.to(state_dtype))


def test_strided_state(device, seed):
    """A state that is a strided view (a slice of a larger cache) is updated in place like a contiguous one."""
    batch, d, n = 2, 6, 4
    arguments = make_step_arguments(device, torch.float32, batch, d, n, 1)
    storage = random_values((batch, d, 2 * n), torch.float32, device)
    view = storage[..., ::2]
    contiguous = view.clone()
    out = run_steps(view, arguments, 1)
    expected = run_steps(contiguous, arguments, 1)
    assert torch.equal(out, expected) and torch.equal(view, contiguous)
    assert torch.equal(storage[..., 1::2], storage[..., 1::2].clone())


def test_gradients_through_steps(device, seed):
    """Arguments that require grad take the step through linrec.selective_scan (the op has no derivative): the
    op's bits, and the loop's gradients, over two steps."""
    batch, d, n = 2, 6, 4
    arguments = make_step_arguments(device, torch.float32, batch, d, n, 2, groups=2)
    initial = random_values((batch, d, n), torch.float32, device)
    state = initial.clone()
    with torch.no_grad():
        expected_bits = run_steps(state, arguments, 2)
    leaves = {name: arguments[name].requires_grad_() for name in ("u", "delta", "B", "C", "D", "z", "delta_bias")}
    start = initial.clone().requires_grad_()
    stepped = start.clone()
    out = run_steps(stepped, arguments, 2)
    assert torch.equal(out.detach(), expected_bits) and torch.equal(stepped.detach(), state)

    wide_leaves = {name: wide(tensor).requires_grad_() for name, tensor in leaves.items()}
    wide_start = wide(initial).requires_grad_()
    expected_out, expected_state = loop_reference(**{name: wide(t) for name, t in arguments.items()} | wide_leaves,
                                                  delta_softplus=True, initial=wide_start)
    d_out, d_state = random_values(out.shape, out.dtype, device), random_values(state.shape, state.dtype, device)
    grads = torch.autograd.grad((out, stepped), [*leaves.values(), start], (d_out, d_state))
    expected = torch.autograd.grad((expected_out, expected_state), [*wide_leaves.values(), wide_start],
                                   (wide(d_out), wide(d_state)))
    for name, grad, want in zip([*leaves, "state"], grads, expected):
        assert_matches(grad, want, torch.float32, f"d_{name}")


def test_compile_fullgraph(device, seed):
    """torch.compile(fullgraph=True) of a step: the eager step's bits, the state updated in place."""
    batch, d, n = 2, 6, 4
    arguments = make_step_arguments(device, torch.float32, batch, d, n, 1)
    initial = random_values((batch, d, n), torch.float32, device)
    compiled = torch.compile(run_steps_with_indices, fullgraph=True)
    indices = torch.tensor([1, 0], device=device)
    state, expected_state = initial.clone(), initial.clone()
    out = compiled(state, arguments, indices)
    expected = run_steps_with_indices(expected_state, arguments, indices)
    assert torch.equal(out, expected) and torch.equal(state, expected_state)


def test_docstring_example():
    failures, _ = doctest.testmod(linrec.state_update, extraglobs={"torch": torch}, verbose=False)
    assert failures == 0


def _arguments(batch=2, d=6, n=4):
    return dict(state=torch.zeros(batch, d, n), x=torch.randn(batch, d), dt=torch.rand(batch, d), A=-torch.rand(d, n),
                B=torch.randn(batch, n), C=torch.randn(batch, n))


BAD = [
    (dict(state=torch.zeros(2, 6)), ValueError, r"state must be \(batch, d, n\)"),
    (dict(x=torch.randn(2, 5)), ValueError, r"x must be \(batch, d\)"),
    (dict(dt=torch.rand(2, 6, 1)), ValueError, r"dt must have the shape of x"),
    (dict(A=-torch.rand(6, 3)), ValueError, r"A must be \(d, n\) = \[6, 4\]"),
    (dict(B=torch.randn(2, 3)), ValueError, r"B must be \(batch, n\)"),
    (dict(C=torch.randn(2, 4, 4)), ValueError, r"C must be \(batch, groups, n\).*dividing d = 6"),
    (dict(D=torch.randn(5)), ValueError, r"D must be \(d,\) = \[6\]"),
    (dict(x=torch.randn(2, 6, dtype=torch.float64).to(torch.int32)), TypeError, r"x must be a real floating-point"),
    (dict(B="B"), TypeError, r"B must be a torch.Tensor"),
    (dict(state=torch.zeros(3, 6, 4)), ValueError, r"state must hold a row per batch row \(2"),
    (dict(state_batch_indices=torch.tensor([0, 1.0])), TypeError, r"state_batch_indices must be"),
    (dict(state_batch_indices=torch.tensor([0])), ValueError, r"state_batch_indices must be \(batch,\)"),
    (dict(state_batch_indices=torch.tensor([0, 2])), ValueError, r"must be below state's 2 rows"),
    (dict(state_batch_indices=torch.tensor([1, 1])), ValueError, r"must be distinct"),
    (dict(state=torch.zeros(2, 6, 4, dtype=torch.complex64)), TypeError, r"state is complex"),
    (dict(A=torch.complex(-torch.rand(6, 4), torch.rand(6, 4))), TypeError, r"A is complex .* state must be complex"),
    (dict(dt_softplus=1), TypeError, r"dt_softplus"),
]


@pytest.mark.parametrize("change, error, match", BAD)
def test_bad_arguments(change, error, match):
    arguments = _arguments() | change
    with pytest.raises(error, match=match):
        linrec.selective_state_update(**arguments)


def test_heads_layout_errors():
    state = torch.zeros(2, 4, 3, 8)
    x = torch.randn(2, 4, 3)
    A = -torch.rand(4, 3, 8)
    with pytest.raises(ValueError, match=r"B must be \(batch, groups, n\).*dividing heads = 4"):
        linrec.selective_state_update(state, x, x, A, torch.randn(2, 3, 8), torch.randn(2, 1, 8))
    with pytest.raises(ValueError, match=r"B must be \(batch, groups, n\)"):
        linrec.selective_state_update(state, x, x, A, torch.randn(2, 8), torch.randn(2, 1, 8))
    with pytest.raises(ValueError, match=r"A must be \(heads, head_dim, n\)"):
        linrec.selective_state_update(state, x, x, -torch.rand(4, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8))
