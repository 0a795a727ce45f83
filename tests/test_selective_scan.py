"""linrec.selective_scan (Mamba's S6) against a float64 (complex128) step-by-step loop of Mamba's
equations written here, independent of linrec: outputs, last state and the gradients of every
argument, for real and complex A, every layout of B and C, the optional terms, 16-bit and float64
arguments, odd lengths and strided views; and the errors bad arguments raise."""

from __future__ import annotations

import doctest
import itertools

import pytest
import torch
from helpers import assert_matches, random_values, wide

import linrec
import linrec.ssm

BATCH, D_INNER, N_STATE, GROUPS = 2, 6, 3, 3


def loop_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial=None,
                   cu_seqlens=None):
    """Mamba's equations, one time step at a time, on float64 (complex128) tensors: (out, last state), the
    state starting from ``initial`` (zeros without it) at the start of the batch's rows, or of each packed
    sequence of ``cu_seqlens`` (a list of offsets; batch 1), whose last states are then stacked."""
    batch, d, length = u.shape
    n = A.shape[1]
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = torch.log1p(torch.exp(delta))

    def per_channel(M):
        """B or C as a (batch, d, n, length) tensor: each channel's value at each step."""
        if M.dim() == 2:
            return M[None, :, :, None].expand(batch, d, n, length)
        if A.is_complex() and not M.is_complex():  # (real, imag) pairs along the time dim
            pairs = M.unflatten(-1, (length, 2))
            M = torch.complex(pairs[..., 0], pairs[..., 1])
        if M.dim() == 3:  # shared by the channels
            return M[:, None].expand(batch, d, n, length)
        group_of_channel = torch.arange(d) // (d // M.shape[1])
        return M[:, group_of_channel]

    # Each operand's steps taken apart once: indexing a step at a time would give each step's gradient
    # the operand's full size.
    B_steps, C_steps = per_channel(B).unbind(-1), per_channel(C).unbind(-1)
    u_steps, delta_steps = u.unbind(-1), delta.unbind(-1)
    bounds = [0, length] if cu_seqlens is None else list(cu_seqlens)
    ys, last_states = [], []
    for sequence, (begin, end) in enumerate(zip(bounds, bounds[1:])):
        if initial is None:
            state = torch.zeros(batch, d, n, dtype=A.dtype)
        else:
            state = (initial if cu_seqlens is None else initial[sequence][None]).to(A.dtype)
        for t in range(begin, end):
            dt = delta_steps[t][..., None]
            state = torch.exp(dt * A) * state + dt * B_steps[t] * u_steps[t][..., None]
            y = (state * C_steps[t]).sum(-1)
            ys.append(2 * y.real if A.is_complex() else y)
        last_states.append(state)
    out = torch.stack(ys, dim=-1) if ys else u.new_zeros(batch, d, 0)
    state = last_states[0] if cu_seqlens is None else torch.cat(last_states)
    if D is not None:
        out = out + u * D[:, None]
    if z is not None:
        out = out * z * torch.sigmoid(z)
    return out, state


def make_arguments(device, dtype, complex_A=False, B_layout="shared", C_layout="shared", length=33, D=True, z=True,
                   delta_bias=True, delta_softplus=True, param_dtype=None, groups=GROUPS, batch=BATCH, d=D_INNER,
                   n=N_STATE):
    """Random arguments: u, delta, z, time-varying B and C in ``dtype``; A, D, delta_bias and fixed B and C in
    ``param_dtype`` (complex when A is). Decaying states (Re A < 0, delta > 0), never zeros."""
    param_dtype = param_dtype or dtype
    complex_dtype = torch.complex128 if param_dtype == torch.float64 else torch.complex64
    decay = -(0.5 + torch.rand(d, n, dtype=torch.float64))
    A = torch.complex(decay, 3 * torch.randn(d, n, dtype=torch.float64)).to(complex_dtype) if complex_A else decay
    if delta_softplus:  # softplus(-1 + N(0, 0.5^2)): about 0.3
        delta = -1 + 0.5 * torch.randn(batch, d, length, dtype=torch.float64)
    else:
        delta = 0.05 + 0.5 * torch.rand(batch, d, length, dtype=torch.float64)

    def projection(layout):
        time_size = 2 * length if complex_A else length
        if layout == "fixed":
            return random_values((d, n), complex_dtype if complex_A else param_dtype, device)
        if layout == "fixed-real":  # a real fixed B or C with a complex A
            return random_values((d, n), param_dtype, device)
        if layout == "shared":
            return random_values((batch, n, time_size), dtype, device)
        if layout == "grouped":
            return random_values((batch, groups, n, time_size), dtype, device)
        raise ValueError(layout)

    arguments = dict(
        u=random_values((batch, d, length), dtype, device),
        delta=delta.to(dtype).to(device),
        A=A.to(complex_dtype if complex_A else param_dtype).to(device),
        B=projection(B_layout),
        C=projection(C_layout),
        D=random_values((d,), param_dtype, device) if D else None,
        z=random_values((batch, d, length), dtype, device) if z else None,
        delta_bias=(0.3 * random_values((d,), param_dtype, device)) if delta_bias else None,
    )
    return arguments, dict(delta_softplus=delta_softplus)


def check_against_loop(arguments, options, out_dtype=None, cu_seqlens=None):
    """Outputs, last state and every argument's gradient (autograd, both results) against the loop;
    ``cu_seqlens``, a list of offsets, packs the sequences."""
    leaves = {name: tensor.requires_grad_() for name, tensor in arguments.items() if tensor is not None}
    u, A = arguments["u"], arguments["A"]
    offsets = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=u.device)
    out, last_state = linrec.selective_scan(**arguments, **options, return_last_state=True, cu_seqlens=offsets)
    real_dtype = torch.float64 if any(t.dtype in (torch.float64, torch.complex128) for t in leaves.values()) else torch.float32
    state_dtype = (torch.complex128 if real_dtype == torch.float64 else torch.complex64) if A.is_complex() else real_dtype
    rows = u.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    assert out.shape == u.shape and out.dtype == (out_dtype or u.dtype) and out.device == u.device
    assert last_state.shape == (rows, u.shape[1], A.shape[1]) and last_state.dtype == state_dtype

    wide_leaves = {name: wide(tensor).requires_grad_() for name, tensor in leaves.items()}
    expected_out, expected_state = loop_reference(**wide_leaves, **options, cu_seqlens=cu_seqlens)
    assert_matches(out, expected_out, out.dtype, "out")
    assert_matches(last_state, expected_state, state_dtype, "last state")

    d_out = random_values(out.shape, out.dtype, out.device)
    d_state = random_values(last_state.shape, last_state.dtype, last_state.device)
    # Of length 0 the loop uses no argument but initial: their gradients are zero.
    grads = torch.autograd.grad((out, last_state), list(leaves.values()), (d_out, d_state), materialize_grads=True)
    expected = torch.autograd.grad((expected_out, expected_state), list(wide_leaves.values()), (wide(d_out), wide(d_state)),
                                   materialize_grads=True)
    steps = u.shape[0] * u.shape[-1]
    for (name, leaf), grad, want in zip(leaves.items(), grads, expected):
        assert grad.shape == leaf.shape and grad.dtype == leaf.dtype, name
        # A, D, delta_bias and fixed B and C have no time: their gradients sum a term a step.
        summed = name in ("A", "D", "delta_bias") or (name in ("B", "C") and leaf.dim() == 2)
        assert_matches(grad, want, leaf.dtype, f"d_{name}", terms=steps if summed else 1)


# (B, C): fixed, shared over the channels, per group of channels, and mixed
LAYOUTS = [("fixed", "fixed"), ("shared", "shared"), ("grouped", "grouped"), ("shared", "grouped"), ("grouped", "fixed")]
# (dtype of u, delta, z and time-varying B/C, dtype of A, D, delta_bias and fixed B/C): 16-bit
# activations with float32 parameters, as Mamba trains
DTYPES = [(torch.float32, torch.float32), (torch.float64, torch.float64), (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("layouts", LAYOUTS, ids="-".join)
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda pair: str(pair[0]).removeprefix("torch."))
def test_layouts_and_dtypes(device, seed, dtypes, complex_A, layouts):
    arguments, options = make_arguments(device, dtypes[0], complex_A, *layouts, param_dtype=dtypes[1])
    check_against_loop(arguments, options)


@pytest.mark.parametrize("D, z, delta_bias, delta_softplus", list(itertools.product([False, True], repeat=4)),
                         ids=lambda flag: "on" if flag else "off")
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_optional_terms(device, seed, complex_A, D, z, delta_bias, delta_softplus):
    arguments, options = make_arguments(device, torch.float32, complex_A, "shared", "grouped", length=7, D=D, z=z,
                                        delta_bias=delta_bias, delta_softplus=delta_softplus)
    check_against_loop(arguments, options)


def _initial(arguments, rows, device):
    """A random initial state of ``rows`` rows, complex when A is."""
    A = arguments["A"]
    return random_values((rows, *A.shape), A.dtype if A.is_complex() else arguments["u"].dtype, device)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
@pytest.mark.parametrize("length", [0, 1, 33])
def test_initial_state(device, seed, complex_A, length):
    arguments, options = make_arguments(device, torch.float32, complex_A, length=length)
    arguments["initial"] = _initial(arguments, BATCH, device)
    check_against_loop(arguments, options)


# Packed sequences of (1, d, 40): empty ones first, last and in the middle, one of a single step.
PACKINGS = [[0, 40], [0, 0, 7, 7, 8, 40], [0, 13, 27, 40, 40]]


@pytest.mark.parametrize("with_initial", [False, True], ids=["zero-state", "initial"])
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
@pytest.mark.parametrize("offsets", PACKINGS, ids=lambda offsets: "-".join(map(str, offsets)))
def test_packed_sequences(device, seed, offsets, complex_A, with_initial):
    """Each packed sequence is its own scan: from its row of ``initial`` (or zeros), with its own last state
    and gradients, and nothing crossing a boundary."""
    arguments, options = make_arguments(device, torch.float64, complex_A, "grouped", "shared", length=offsets[-1],
                                        batch=1)
    if with_initial:
        arguments["initial"] = _initial(arguments, len(offsets) - 1, device)
    check_against_loop(arguments, options, cu_seqlens=offsets)


@pytest.mark.parametrize("length", [1, 2, 7, 33, 130])
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_lengths(device, seed, complex_A, length):
    arguments, options = make_arguments(device, torch.float32, complex_A, "fixed", "shared", length=length)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("groups", [1, 2, D_INNER])
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_group_counts(device, seed, complex_A, groups):
    """4-dim B and C of one group (all channels), of 2 and of one group per channel."""
    arguments, options = make_arguments(device, torch.float32, complex_A, "grouped", "grouped", length=9, groups=groups)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_real_fixed_projections_with_complex_A(device, seed, complex_A):
    """A real (d, n) B or C with a complex A is promoted to complex."""
    arguments, options = make_arguments(device, torch.float32, True, "fixed-real", "fixed-real" if complex_A else "shared")
    check_against_loop(arguments, options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_all_16_bit(device, seed, dtype, complex_A):
    """Every real argument in a 16-bit type (A complex64 when complex): float32 state, output in u's dtype."""
    arguments, options = make_arguments(device, dtype, complex_A, "grouped", "shared", length=17, param_dtype=dtype)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_strided_arguments(device, seed, complex_A):
    """Transposed views, as Mamba's projections produce them: (batch, length, d) -> (batch, d, length)."""
    length, time_size = 21, 42 if complex_A else 21
    arguments, options = make_arguments(device, torch.float32, complex_A, "fixed", "fixed", length=length)
    for name in ("u", "delta", "z"):
        arguments[name] = arguments[name].transpose(1, 2).contiguous().transpose(1, 2)
    arguments["A"] = arguments["A"].T.contiguous().T
    arguments["B"] = random_values((BATCH, time_size, N_STATE), torch.float32, device).transpose(1, 2)
    arguments["C"] = random_values((BATCH, time_size, 2 * GROUPS, N_STATE), torch.float32, device)[:, :, ::2].permute(0, 2, 3, 1)
    assert not arguments["u"].is_contiguous() and not arguments["C"].is_contiguous()
    check_against_loop(arguments, options)


def test_complex_time_varying_projections_read_as_they_are(device, seed):
    """With a complex A, a complex (batch, n, length) B equals the real form of (real, imag) pairs."""
    arguments, options = make_arguments(device, torch.float64, True, "shared", "grouped", length=11)
    pairs = {name: arguments[name].unflatten(-1, (11, 2)) for name in ("B", "C")}
    complex_form = dict(arguments, B=torch.complex(pairs["B"][..., 0], pairs["B"][..., 1]),
                        C=torch.complex(pairs["C"][..., 0], pairs["C"][..., 1]))
    expected = linrec.selective_scan(**arguments, **options, return_last_state=True)
    actual = linrec.selective_scan(**complex_form, **options, return_last_state=True)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    check_against_loop(complex_form, options)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_results(device, seed, complex_A):
    """Without return_last_state a tensor; the last state has its own memory; a length of 0 gives an empty
    output and a zero state."""
    arguments, options = make_arguments(device, torch.bfloat16, complex_A, "shared", "shared", length=5, param_dtype=torch.float32)
    out = linrec.selective_scan(**arguments, **options)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (BATCH, D_INNER, 5)
    _, last_state = linrec.selective_scan(**arguments, **options, return_last_state=True)
    assert last_state.is_contiguous() and last_state.untyped_storage().nbytes() == last_state.numel() * last_state.element_size()

    empty, _ = make_arguments(device, torch.float32, complex_A, "shared", "grouped", length=0)
    out, last_state = linrec.selective_scan(**empty, **options, return_last_state=True)
    assert out.shape == (BATCH, D_INNER, 0)
    assert last_state.shape == (BATCH, D_INNER, N_STATE) and not last_state.any()


@pytest.mark.parametrize("backend", ["composed", "loop", "hop"])
def test_reference_backends(device, seed, backend):
    arguments, options = make_arguments(device, torch.float64, False, "shared", "grouped", length=13)
    expected = linrec.selective_scan(**arguments, **options, return_last_state=True)
    actual = linrec.selective_scan(**arguments, **options, return_last_state=True, backend=backend)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_docstring_example():
    torch.manual_seed(0)
    assert doctest.testmod(linrec.ssm, raise_on_error=True).attempted > 0


def _bad(change):
    """Valid arguments (real A, shared B and C, length 5), with ``change`` applied to them."""
    def build():
        arguments, options = make_arguments("cpu", torch.float32, False, "shared", "shared", length=5)
        arguments.update(options)
        change(arguments)
        return arguments
    return build


def _complex_A(arguments):
    arguments["A"] = arguments["A"].to(torch.complex64)


def _set(name, value):
    return lambda arguments: arguments.update({name: value(arguments) if callable(value) else value})


L5, TWO_L = 5, 10
def _packed(offsets, **more):
    """The arguments with a batch of 1 and the cu_seqlens ``offsets(arguments)`` (and ``more``)."""
    def change(arguments):
        for name in ("u", "delta", "z", "B", "C"):
            arguments[name] = arguments[name][:1]
        arguments["cu_seqlens"] = offsets(arguments)
        arguments.update(more)
    return change


ERRORS = [
    ("u-not-3-dim", _set("u", lambda a: a["u"][0]), ValueError, r"u must be 3-dim \(batch, d, length\), got shape \[6, 5\]"),
    ("u-not-a-tensor", _set("u", [1.0]), TypeError, "u must be a torch.Tensor, got list"),
    ("u-integer", _set("u", lambda a: a["u"].long()), TypeError, "u must be a real floating-point tensor, got torch.int64"),
    ("delta-shape", _set("delta", lambda a: a["delta"][:, :, :4]), ValueError,
     r"delta must have the shape of u \(batch, d, length\) = \[2, 6, 5\], got \[2, 6, 4\]"),
    ("z-shape", _set("z", lambda a: a["z"][:1]), ValueError, r"z must have the shape of u .* got \[1, 6, 5\]"),
    ("delta-complex", _set("delta", lambda a: a["delta"].to(torch.complex64)), TypeError,
     "delta must be a real floating-point tensor, got torch.complex64"),
    ("A-not-2-dim", _set("A", lambda a: a["A"][0]), ValueError, r"A must be 2-dim \(d, n\) with d = 6 .* got shape \[3\]"),
    ("A-d-mismatch", _set("A", lambda a: a["A"][:4]), ValueError, r"A must be 2-dim \(d, n\) with d = 6 .* got shape \[4, 3\]"),
    ("B-5-dims", _set("B", lambda a: a["B"][:, None, None]), ValueError,
     r"B must be \(d, n\), \(batch, n, length\) or \(batch, groups, n, length\), got 5 dims"),
    ("C-1-dim", _set("C", lambda a: a["C"][0, 0]), ValueError, "C must be .* got 1 dims"),
    ("B-fixed-shape", _set("B", lambda a: a["A"].new_ones(6, 4)), ValueError,
     r"a fixed B must have the shape of A \(d, n\) = \[6, 3\], got \[6, 4\]"),
    ("B-shared-n", _set("B", lambda a: a["B"][:, :2]), ValueError, r"B must be \(batch, n, length\) = \[2, 3, 5\], got \[2, 2, 5\]"),
    ("C-shared-batch", _set("C", lambda a: a["C"][:1]), ValueError, r"C must be \(batch, n, length\) = \[2, 3, 5\], got \[1, 3, 5\]"),
    ("C-shared-length", _set("C", lambda a: a["C"][..., :4]), ValueError, r"C must be \(batch, n, length\) = \[2, 3, 5\], got \[2, 3, 4\]"),
    ("B-grouped-n", _set("B", lambda a: a["B"].new_ones(2, 3, 4, L5)), ValueError,
     r"B must be \(batch, groups, n, length\) = \[2, 3, 3, 5\], got \[2, 3, 4, 5\]"),
    ("B-groups-do-not-divide-d", _set("B", lambda a: a["B"].new_ones(2, 4, 3, L5)), ValueError,
     r"the groups of B \(its dim 1, 4\) must divide d = 6"),
    ("C-zero-groups", _set("C", lambda a: a["C"].new_ones(2, 0, 3, L5)), ValueError, r"the groups of C \(its dim 1, 0\) must divide d = 6"),
    ("B-complex-real-A", _set("B", lambda a: a["B"].to(torch.complex64)), TypeError,
     r"B is complex \(torch.complex64\) but A is real \(torch.float32\)"),
    ("C-complex-fixed-real-A", _set("C", lambda a: torch.ones(6, 3, dtype=torch.complex64)), TypeError, "C is complex"),
    ("B-not-interleaved-complex-A", _complex_A, ValueError,
     r"B must be \(batch, n, length\) = \[2, 3, 10\], its last dim holding 2 \* length = 10 interleaved \(real, imag\) "
     r"values as A is complex, got \[2, 3, 5\]"),
    ("D-shape", _set("D", lambda a: a["D"][:5]), ValueError, r"D must have shape \(d,\) = \[6\], got \[5\]"),
    ("D-2-dim", _set("D", lambda a: a["D"][:, None]), ValueError, r"D must have shape \(d,\) = \[6\], got \[6, 1\]"),
    ("delta_bias-shape", _set("delta_bias", lambda a: a["delta_bias"].new_ones(2, 6)), ValueError,
     r"delta_bias must have shape \(d,\) = \[6\], got \[2, 6\]"),
    ("D-complex", _set("D", lambda a: a["D"].to(torch.complex64)), TypeError, "D must be a real floating-point tensor"),
    ("A-integer", _set("A", lambda a: a["A"].long()), TypeError, "A must be a real or complex floating-point tensor, got torch.int64"),
    ("B-none", _set("B", None), TypeError, "B must be a torch.Tensor, got None"),
    ("delta_softplus-not-bool", _set("delta_softplus", 1), TypeError, "delta_softplus must be a bool, got int"),
    ("return_last_state-not-bool", _set("return_last_state", "yes"), TypeError, "return_last_state must be a bool, got str"),
    ("A-on-meta", _set("A", lambda a: a["A"].to("meta")), ValueError, r"A must be on the device of u \(cpu\), got meta"),
    ("z-on-meta", _set("z", lambda a: a["z"].to("meta")), ValueError, r"z must be on the device of u \(cpu\), got meta"),
    ("initial-shape", _set("initial", lambda a: torch.zeros(2, 6, 4)), ValueError,
     r"initial must have shape \(batch, d, n\) = \[2, 6, 3\], got \[2, 6, 4\]"),
    ("initial-complex-real-A", _set("initial", lambda a: torch.zeros(2, 6, 3, dtype=torch.complex64)), TypeError,
     r"initial is complex \(torch.complex64\) but A is real"),
    ("initial-not-a-tensor", _set("initial", [0.0]), TypeError, "initial must be a torch.Tensor, got list"),
    ("cu_seqlens-batch-2", _set("cu_seqlens", lambda a: torch.tensor([0, 2, 5])), ValueError,
     r"with cu_seqlens, u must hold its sequences packed along its length with a batch of 1, got shape \[2, 6, 5\]"),
    ("cu_seqlens-float", _packed(lambda a: torch.tensor([0.0, 5.0])), TypeError, "cu_seqlens must be torch.int32 or torch.int64"),
    ("cu_seqlens-end", _packed(lambda a: torch.tensor([0, 2, 4])), ValueError,
     r"cu_seqlens must end at the length of the time dim \(5\), got 4"),
    ("backend-unknown", _set("backend", "fused"), ValueError,
     "backend must be one of 'auto', 'composed', 'triton', 'loop', 'hop', 'heinsen', got 'fused'"),
    ("cu_seqlens-initial-rows", _packed(lambda a: torch.tensor([0, 2, 5]), initial=torch.zeros(1, 6, 3)), ValueError,
     r"initial must have shape \(sequences \(cu_seqlens' offsets - 1\), d, n\) = \[2, 6, 3\], got \[1, 6, 3\]"),
]


@pytest.mark.parametrize("change, error, match", [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_bad_arguments(seed, change, error, match):
    arguments = _bad(change)()
    with pytest.raises(error, match=match) as raised:
        linrec.selective_scan(**arguments)
    assert str(raised.value).startswith("linrec.selective_scan: ")


def test_interleaved_complex_A_needs_twice_the_length(seed):
    """With a complex A, the real (batch, n, 2 * length) form is accepted and (batch, n, length) is not."""
    arguments, options = make_arguments("cpu", torch.float32, True, "shared", "grouped", length=L5)
    assert arguments["B"].shape[-1] == TWO_L
    linrec.selective_scan(**arguments, **options)
    arguments["C"] = arguments["C"][..., :L5]
    with pytest.raises(ValueError, match=r"C must be \(batch, groups, n, length\) = \[2, 3, 3, 10\], its last dim holding"):
        linrec.selective_scan(**arguments, **options)


def test_devices_must_match(device, seed):
    """On cuda: an argument left on the CPU is named (on the CPU alone: the meta cases above)."""
    if device == "cpu":
        pytest.skip("needs a second device")
    arguments, options = make_arguments(device, torch.float32, False, "shared", "shared", length=5)
    arguments["delta_bias"] = arguments["delta_bias"].cpu()
    with pytest.raises(ValueError, match=r"delta_bias must be on the device of u \(cuda:0\), got cpu"):
        linrec.selective_scan(**arguments, **options)


def test_torch_func_transforms(device, seed):
    """torch.func.grad, vmap and jvp through linrec.selective_scan (the composed scan runs under a
    transform) give autograd's gradients of the fused call, the per-item results and, the output being
    linear in u, the output at the tangent."""
    arguments, options = make_arguments(device, torch.float64, False, "shared", "grouped", length=21, batch=2)
    rest = {name: tensor for name, tensor in arguments.items() if name not in ("u", "delta")}

    def call(u, delta):
        return linrec.selective_scan(u, delta, **rest, **options)

    def loss(u, delta):
        return call(u, delta).square().sum()

    u, delta = arguments["u"], arguments["delta"]
    grads = torch.func.grad(loss, argnums=(0, 1))(u, delta)
    leaves = [u.clone().requires_grad_(), delta.clone().requires_grad_()]
    expected = torch.autograd.grad(loss(*leaves), leaves)
    for name, got, want in zip(("d_u", "d_delta"), grads, expected):
        assert_matches(got, want.cpu(), torch.float64, f"torch.func.grad {name}")

    stacked = torch.stack([u, 2 * u.flip(-1), -u])
    batched = torch.func.vmap(call, in_dims=(0, None))(stacked, delta)
    for index, item in enumerate(stacked):
        assert_matches(batched[index], call(item, delta).cpu(), torch.float64, f"vmap item {index}")

    tangent = random_values(u.shape, u.dtype, device)
    out, out_tangent = torch.func.jvp(lambda u: call(u, delta), (u,), (tangent,))
    assert_matches(out, call(u, delta).cpu(), torch.float64, "jvp output")
    assert_matches(out_tangent, call(tangent, delta).cpu(), torch.float64, "jvp tangent")


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_compile_fullgraph(device, seed, complex_A):
    """torch.compile(fullgraph=True) traces the whole call, packed sequences, initial and last states
    included, to the eager results and gradients."""
    torch._dynamo.reset()
    arguments, options = make_arguments(device, torch.float32, complex_A, length=20, batch=1)
    arguments["initial"] = _initial(arguments, 3, device)
    offsets = torch.tensor([0, 6, 6, 20], device=device)

    def call(arguments):
        return linrec.selective_scan(**arguments, **options, return_last_state=True, cu_seqlens=offsets)

    leaves = {name: tensor.requires_grad_() for name, tensor in arguments.items() if tensor is not None}
    eager = call(leaves)
    traced = torch.compile(call, fullgraph=True, backend="aot_eager")(leaves)
    cotangents = [random_values(result.shape, result.dtype, result.device) for result in eager]
    for name, got, want in zip(("out", "last state"), traced, eager):
        assert_matches(got, want.detach().cpu(), want.dtype, name)
    traced_grads = torch.autograd.grad(traced, list(leaves.values()), cotangents)
    eager_grads = torch.autograd.grad(eager, list(leaves.values()), cotangents)
    for name, got, want in zip(leaves, traced_grads, eager_grads):
        assert_matches(got, want.cpu(), got.dtype, f"d_{name}")


def test_compile_reads_the_deterministic_setting_once():
    """Whether the fused backward must sum in a fixed order is read as a constant at tracing: the check carries
    torch.compiler.assume_constant_result's mark (set without that function, which imports torch._dynamo), and
    fullgraph tracing, which cannot put the warn_only flag into a graph, takes it."""
    from linrec._core.selective_scan import _reproducible_sums_required

    marked = torch.compiler.assume_constant_result(lambda: None)
    assert vars(marked).items() <= vars(_reproducible_sums_required).items()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x + _reproducible_sums_required(), fullgraph=True, backend="eager")
    assert compiled(torch.zeros(())) == int(_reproducible_sums_required())


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_export(device, seed, complex_A):
    """torch.export captures the call (packed, with initial and last states) as one graph around the fused
    forward op, and the exported program gives the eager results."""
    arguments, options = make_arguments(device, torch.float32, complex_A, length=20, batch=1)
    arguments["initial"] = _initial(arguments, 3, device)
    names = [name for name, tensor in arguments.items() if tensor is not None]
    offsets = torch.tensor([0, 6, 6, 20], device=device)

    class Scan(torch.nn.Module):
        def forward(self, *tensors):
            return linrec.selective_scan(**dict(zip(names, tensors)), **options, return_last_state=True,
                                         cu_seqlens=offsets)

    tensors = tuple(arguments[name] for name in names)
    program = torch.export.export(Scan(), tensors)
    assert any(node.target is torch.ops.linrec.selective_scan_forward.default for node in program.graph.nodes)
    for name, got, want in zip(("out", "last state"), program.module()(*tensors), Scan()(*tensors)):
        assert_matches(got, want.cpu(), want.dtype, name)


# Lengths around the fused kernels' chunk of 512 steps (the states saved for the backward, and the GPU
# block kernels' tile) and their threads' 8 and 16 steps.
CHUNK_LENGTHS = [8, 9, 17, 511, 512, 513, 1025]


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
@pytest.mark.parametrize("length", CHUNK_LENGTHS)
def test_chunk_boundaries(device, seed, length, complex_A):
    """Outputs, last state and gradients across the fused kernels' chunks, with an initial state."""
    arguments, options = make_arguments(device, torch.float32, complex_A, "grouped", "shared", length=length, batch=1,
                                        d=2, n=2, groups=2)
    arguments["initial"] = _initial(arguments, 1, device)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("offsets", [[0, 1000, 1024, 1024, 1030, 2050], [0, 0, 1024, 2049, 2050], [0, 100, 100, 300, 400]],
                         ids=["inside-and-at-chunk-ends", "empty-first-at-the-end", "short-tile"])
@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_packed_sequences_across_chunks(device, seed, offsets, complex_A):
    arguments, options = make_arguments(device, torch.float32, complex_A, "shared", "grouped", length=offsets[-1],
                                        batch=1, d=2, n=2, groups=1)
    arguments["initial"] = _initial(arguments, len(offsets) - 1, device)
    check_against_loop(arguments, options, cu_seqlens=offsets)


# The GPU's lane kernels take B and C varying with the same groups, or both fixed, and n <= 128: a lane
# walks time for four state dims (one up to n = 4, or where the call has too few channels to fill the
# GPU), over tiles of 16 steps.
LANE_LENGTHS = [1, 15, 16, 17, 511, 512, 513, 1100]


@pytest.mark.parametrize("length", LANE_LENGTHS)
@pytest.mark.parametrize("n", [3, 16, 24, 29, 40, 64, 70, 97, 128])
@pytest.mark.parametrize("projections", ["grouped", "fixed"])
def test_lane_kernels(device, seed, n, length, projections):
    """Tiles and chunks, state dims that leave a lane's last ones unused (whole lanes: 3, 24, 40; part of a
    lane: 29, 70, 97), with an initial state; on the GPU, every policy of four state dims a lane (a warp a
    channel above n = 64; n = 70's backward in the block kernels from the lanes' checkpoints). The CPU runs
    the same loop for every n: n = 24, 29, 70, 97 and 128 add nothing there."""
    if device == "cpu" and n in (24, 29, 70, 97, 128):
        pytest.skip("a policy of the GPU's kernels")
    arguments, options = make_arguments(device, torch.float32, False, projections, projections, length=length,
                                        batch=1, d=6, n=n, groups=2)
    arguments["initial"] = _initial(arguments, 1, device)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [1, 4, 7, 16, 24, 31, 64, 65, 126])
@pytest.mark.parametrize("projections", ["grouped", "fixed"])
def test_lane_kernels_many_channels(device, seed, dtype, n, projections):
    """Channels enough for the GPU's Narrow policies (one state dim a lane and four lanes a
    channel up to n = 4, four state dims a lane above: four lanes up to 16, eight up to 32, sixteen up to
    64, thirty-two up to 128); each group's last block holds fewer channels than it has slots. The CPU runs the same loop for
    every n: one case of it."""
    if device == "cpu" and (n, projections) != (16, "grouped"):
        pytest.skip("a plan of the GPU's kernels")
    arguments, options = make_arguments(device, dtype, False, projections, projections, length=37, batch=3, d=2900,
                                        n=n, groups=2, param_dtype=torch.float32)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("batch, d, n, length", [(4, 2900, 64, 37), (4, 2900, 30, 37), (1, 512, 40, 1100)],
                         ids=["batch", "batch-eight-lanes", "split-rows"])
def test_lane_kernels_eight_warp_blocks(device, seed, batch, d, n, length):
    """Calls an H100's forward plan runs in blocks of eight warps (above n = 16): a batch of short rows,
    and a single row split along time into three segments, with an initial state and state dims that
    leave the lanes' last ones unused (n = 40). The CPU runs the same loop for every call."""
    if device == "cpu":
        pytest.skip("a plan of the GPU's kernels")
    arguments, options = make_arguments(device, torch.float32, False, "grouped", "grouped", length=length,
                                        batch=batch, d=d, n=n, groups=2)
    arguments["initial"] = _initial(arguments, batch, device)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("n", [2, 8, 27, 40, 70, 100])
@pytest.mark.parametrize("projections", ["grouped", "fixed"])
def test_lane_kernels_split_rows(device, seed, n, projections):
    """One row of 4096 channels (1024 above n = 64, where the float64 loop's states are the costliest) and
    1100 steps: on the GPU, the row split along time where the plan finds too few blocks, with an initial
    state; lanes of one state dim at n <= 4."""
    if device == "cpu":
        pytest.skip("a plan of the GPU's kernels")
    arguments, options = make_arguments(device, torch.float32, False, projections, projections, length=1100,
                                        batch=1, d=4096 if n <= 64 else 1024, n=n, groups=2)
    arguments["initial"] = _initial(arguments, 1, device)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("offsets", [[0, 0, 17, 17, 40, 600], [0, 16, 32, 33]], ids=["empty", "at-tile-ends"])
@pytest.mark.parametrize("projections", ["shared", "fixed"])
def test_lane_kernels_packed_many_channels(device, seed, offsets, projections):
    """Packed sequences in the GPU's Narrow policies: one state dim a lane (n = 4), and fixed B and C, which
    the lanes take from n = 9."""
    arguments, options = make_arguments(device, torch.float32, False, projections, projections, length=offsets[-1],
                                        batch=1, d=1024, n=4 if projections == "shared" else 12)
    arguments["initial"] = _initial(arguments, len(offsets) - 1, device)
    check_against_loop(arguments, options, cu_seqlens=offsets)


@pytest.mark.parametrize("offsets", [[0, 200, 512, 512, 600, 1100], [0, 0, 17, 17, 40], [0, 16, 32, 33]],
                         ids=["across-chunks", "empty", "at-tile-ends"])
@pytest.mark.parametrize("n", [16, 70])
def test_lane_kernels_packed(device, seed, offsets, n):
    """Packed sequences; on the GPU, n = 70 runs the forward in the lanes and the backward in the block kernels."""
    arguments, options = make_arguments(device, torch.float32, False, "shared", "shared", length=offsets[-1],
                                        batch=1, d=3, n=n)
    arguments["initial"] = _initial(arguments, len(offsets) - 1, device)
    check_against_loop(arguments, options, cu_seqlens=offsets)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
@pytest.mark.parametrize("n", [300, 1000])
def test_state_dim_beyond_256(device, seed, n, complex_A):
    """State dims past mamba_ssm's 256; on the GPU, 1000 takes more than the default 48 KB of shared memory."""
    arguments, options = make_arguments(device, torch.float32, complex_A, "fixed", "shared", length=5, batch=1, d=2, n=n)
    check_against_loop(arguments, options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_across_chunks(device, seed, dtype):
    """16-bit activations with float32 parameters over more than one chunk, time rows not 16-byte aligned
    (length 1030 of 2-byte values) and aligned (1032)."""
    for length in (1030, 1032):
        arguments, options = make_arguments(device, dtype, False, "grouped", "grouped", length=length, batch=1, d=2,
                                            n=2, groups=1, param_dtype=torch.float32)
        check_against_loop(arguments, options)


@pytest.mark.parametrize("complex_A", [False, True], ids=["real", "complex"])
def test_non_finite_values_follow_the_loop(device, seed, complex_A):
    """A NaN in u and an infinite step reach the outputs where the loop's reach them (forward)."""
    arguments, options = make_arguments(device, torch.float64, complex_A, "shared", "shared", length=40, batch=1, d=3,
                                        n=2, delta_softplus=False)
    arguments["u"][0, 0, 7] = float("nan")
    arguments["delta"][0, 1, 20] = float("inf")
    out, state = linrec.selective_scan(**arguments, **options, return_last_state=True)
    expected_out, expected_state = loop_reference(**{name: wide(tensor) for name, tensor in arguments.items()}, **options)
    torch.testing.assert_close(out.cpu(), expected_out, equal_nan=True)
    torch.testing.assert_close(state.cpu(), expected_state, equal_nan=True)


def _assert_matches_with_non_finite(actual, expected, dtype, what):
    """Infinite and NaN values where the loop has them (the same infinities), the rest close to the loop's."""
    actual = actual.detach().cpu().to(expected.dtype)
    finite = torch.isfinite(expected)
    assert (~finite).any(), f"{what}: the loop has no non-finite value to compare"
    torch.testing.assert_close(actual[~finite], expected[~finite], equal_nan=True, msg=f"{what}: non-finite values")
    assert_matches(actual[finite], expected[finite], dtype, what)


# Long rows of few channels: the GPU splits them along time into segments of 512 steps, over each of
# which a decay of about 0.74 a step has a product that underflows in float32.
SPLIT_LENGTH = 2600


def test_infinite_state_across_split_rows(device, seed):
    """An infinite initial state stays infinite through segments whose product of decays underflows
    (last state), and so does an infinite adjoint carried back to the initial state's gradient."""
    arguments, options = make_arguments(device, torch.float32, False, "grouped", "grouped", length=SPLIT_LENGTH,
                                        batch=1, d=3, n=16, groups=1)
    initial = random_values((1, 3, 16), torch.float32, device)
    initial[0, 0, :3] = float("inf")
    initial[0, 2, 5] = -float("inf")
    arguments["initial"] = initial.requires_grad_()
    out, state = linrec.selective_scan(**arguments, **options, return_last_state=True)
    wide_initial = wide(initial).requires_grad_()
    expected_out, expected_state = loop_reference(**{name: wide(tensor) for name, tensor in arguments.items()
                                                     if name != "initial"}, initial=wide_initial, **options)
    _assert_matches_with_non_finite(state, expected_state, torch.float32, "last state")

    d_out = random_values(out.shape, out.dtype, device)
    d_out[0, 1, -1] = float("inf")
    d_out[0, 0] = 0.0  # the infinite state's channel: its outputs are infinite or NaN
    d_out[0, 2] = 0.0
    (d_initial,) = torch.autograd.grad(out, initial, d_out)
    (expected_d_initial,) = torch.autograd.grad(expected_out, wide_initial, wide(d_out))
    _assert_matches_with_non_finite(d_initial, expected_d_initial, torch.float32, "d_initial")


@pytest.mark.parametrize("complex_A", [False, True], ids=["real", "complex"])
def test_non_finite_values_stay_in_their_packed_sequence(device, seed, complex_A):
    """Packed sequences in long rows of few channels (split along time on the GPU for a real A): an
    infinite state of one sequence does not reach the next one's outputs or last state, and an infinite
    adjoint of one does not reach the earlier one's gradients."""
    offsets = [0, 1300, SPLIT_LENGTH]
    arguments, options = make_arguments(device, torch.float32, complex_A, "grouped", "grouped", length=SPLIT_LENGTH,
                                        batch=1, d=3, n=16, groups=1)
    cu_seqlens = torch.tensor(offsets, device=device)
    expected_out, expected_state = loop_reference(**{name: wide(tensor) for name, tensor in arguments.items()},
                                                  **options, cu_seqlens=offsets)
    polluted = dict(arguments, u=arguments["u"].clone())
    polluted["u"][0, 0, 5] = float("inf")
    out, state = linrec.selective_scan(**polluted, **options, return_last_state=True, cu_seqlens=cu_seqlens)
    assert_matches(out[..., 1300:], expected_out[..., 1300:], torch.float32, "out of the second sequence")
    assert_matches(state[1], expected_state[1], torch.float32, "last state of the second sequence")

    leaves = {name: arguments[name].requires_grad_() for name in ("u", "delta", "z")}
    out = linrec.selective_scan(**arguments, **options, cu_seqlens=cu_seqlens)
    d_out = random_values(out.shape, out.dtype, device)
    d_out[0, :, 2000] = float("inf")
    grads = torch.autograd.grad(out, list(leaves.values()), d_out)
    wide_leaves = {name: wide(tensor).requires_grad_() for name, tensor in leaves.items()}
    expected_out, _ = loop_reference(**{name: wide(tensor) for name, tensor in arguments.items()} | wide_leaves,
                                     **options, cu_seqlens=offsets)
    expected = torch.autograd.grad(expected_out, list(wide_leaves.values()), wide(d_out))
    for name, grad, want in zip(leaves, grads, expected):
        assert_matches(grad[..., :1300], want[..., :1300], torch.float32, f"d_{name} of the first sequence")


def test_more_than_2_31_elements(device, seed):
    """Operands of 2^31 + 2^16 elements (batch 1, d = 65536, 32769 steps, bfloat16; about 30 GB on the
    GPU): the last channels' outputs, last state and gradients equal those of the same channels called
    alone, whose offsets are small."""
    if device == "cpu" or torch.cuda.mem_get_info()[0] < 40 * 2**30:
        pytest.skip("needs a GPU with 40 GB free")
    d, n, length, kept = 2**16, 16, 2**15 + 1, 3

    def activations():  # made on the GPU: a float64 copy on the host would take 17 GB
        return torch.randn(1, d, length, device=device, dtype=torch.bfloat16)

    arguments = dict(u=activations(), delta=(0.5 * activations() - 1), A=-(0.5 + torch.rand(d, n, device=device)),
                     B=torch.randn(1, n, length, device=device, dtype=torch.bfloat16),
                     C=torch.randn(1, n, length, device=device, dtype=torch.bfloat16),
                     D=torch.randn(d, device=device), z=activations(), delta_bias=0.3 * torch.randn(d, device=device))
    options = dict(delta_softplus=True)
    assert arguments["u"].numel() > 2**31
    per_channel = ("u", "delta", "z", "A", "D", "delta_bias")
    leaves = {name: arguments[name].requires_grad_() for name in per_channel}
    out, state = linrec.selective_scan(**arguments, **options, return_last_state=True)
    d_out = random_values((1, kept, length), out.dtype, device)
    d_out_all = torch.zeros_like(out)
    d_out_all[:, -kept:] = d_out
    grads = torch.autograd.grad(out, list(leaves.values()), d_out_all)
    del d_out_all

    def last_channels(name, tensor):
        return tensor[-kept:] if name in ("A", "D", "delta_bias") else tensor[:, -kept:]

    alone = {name: last_channels(name, tensor).detach().requires_grad_() for name, tensor in leaves.items()}
    out_alone, state_alone = linrec.selective_scan(**dict(arguments, **alone), **options, return_last_state=True)
    grads_alone = torch.autograd.grad(out_alone, list(alone.values()), d_out)
    assert_matches(out[:, -kept:], wide(out_alone), out.dtype, "out")
    assert_matches(state[:, -kept:], wide(state_alone), state.dtype, "last state")
    for name, grad, want in zip(leaves, grads, grads_alone):
        assert_matches(last_channels(name, grad), wide(want), grad.dtype, f"d_{name}")


@pytest.mark.parametrize("complex_A", [False, True], ids=["real-A", "complex-A"])
def test_fused_ops_pass_opcheck(device, seed, complex_A):
    """The fused ops' schemas, fake kernels and autograd registration (torch.library.opcheck); with a complex
    A, the state, A, initial, B and C complex (a varying B as (batch, groups, n, length))."""
    arguments, options = make_arguments(device, torch.float32, complex_A, "grouped", "fixed", length=19, batch=1)
    if complex_A:
        pairs = arguments["B"].unflatten(-1, (-1, 2))
        arguments["B"] = torch.complex(pairs[..., 0], pairs[..., 1])
    initial = random_values((2, D_INNER, N_STATE), arguments["A"].dtype, device)
    offsets = torch.tensor([0, 4, 19], device=device)
    forward_args = (arguments["u"], arguments["delta"], arguments["A"], arguments["B"], arguments["C"],
                    arguments["D"], arguments["z"], arguments["delta_bias"], True, initial, offsets)
    for tensor in forward_args:
        if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()):
            tensor.requires_grad_()
    torch.library.opcheck(torch.ops.linrec.selective_scan_forward.default, forward_args)
    out, checkpoints, last_state = torch.ops.linrec.selective_scan_forward(*forward_args)
    backward_args = (random_values(out.shape, out.dtype, device), random_values(last_state.shape, last_state.dtype, device),
                     *[t.detach() if isinstance(t, torch.Tensor) else t for t in forward_args], checkpoints.detach())
    torch.library.opcheck(torch.ops.linrec.selective_scan_backward.default, backward_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_second_derivatives_raise_unless_composed(device, seed):
    """The fused kernels give first derivatives; a second one raises rather than come out wrong, and the
    composed scan gives it (d^2 out / d delta^2: the output is nonlinear in delta)."""
    arguments, options = make_arguments(device, torch.float64, False, "shared", "shared", length=6, batch=1, d=2, n=2)
    delta = arguments["delta"].requires_grad_()
    out = linrec.selective_scan(**arguments, **options)
    (grad,) = torch.autograd.grad(out.sum(), delta, create_graph=True)
    with pytest.raises(NotImplementedError, match="first derivatives only"):
        torch.autograd.grad(grad.sum(), delta)
    out = linrec.selective_scan(**arguments, **options, backend="composed")
    (grad,) = torch.autograd.grad(out.sum(), delta, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), delta)
    on_cpu = {name: wide(tensor) for name, tensor in arguments.items()}
    on_cpu["delta"].requires_grad_()
    expected_out, _ = loop_reference(**on_cpu, **options)
    (expected_grad,) = torch.autograd.grad(expected_out.sum(), on_cpu["delta"], create_graph=True)
    (expected,) = torch.autograd.grad(expected_grad.sum(), on_cpu["delta"])
    torch.testing.assert_close(second.cpu(), expected)


def test_deterministic_mode_repeats_the_gradients(device, seed):
    """Under torch.use_deterministic_algorithms(True), the gradients of varying B and C repeat bit for bit."""
    arguments, options = make_arguments(device, torch.float32, False, "shared", "grouped", length=300, batch=2)
    leaves = {name: tensor.requires_grad_() for name, tensor in arguments.items() if tensor is not None}
    torch.use_deterministic_algorithms(True)
    runs = []
    for _ in range(2):
        out = linrec.selective_scan(**leaves, **options)
        runs.append(torch.autograd.grad(out, [leaves["B"], leaves["C"]], torch.ones_like(out)))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("projections", ["grouped", "fixed"])
def test_deterministic_fused_backward(device, seed, projections):
    """The fused backward op's deterministic mode: B's and C's gradients the same bits on every run and the
    values of the default mode (atomic sums of varying ones on the GPU), with groups of channels that fill
    one block and part of another, rows split along time; a call whose gradient terms only add atomically
    is refused."""
    arguments, options = make_arguments(device, torch.float32, False, projections, projections, length=1100, batch=2,
                                        d=70, n=16, groups=2)
    forward_args = [arguments[name] for name in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    out, checkpoints, last_state = torch.ops.linrec.selective_scan_forward(*forward_args, True, None, None)
    d_out = random_values(out.shape, out.dtype, device)

    def backward(deterministic):
        return torch.ops.linrec.selective_scan_backward(d_out, None, *forward_args, True, None, None, checkpoints,
                                                        deterministic=deterministic)

    first, second, atomic = backward(True), backward(True), backward(False)
    for index, name in ((3, "d_B"), (4, "d_C")):
        assert torch.equal(first[index], second[index]), name
        assert_matches(first[index], wide(atomic[index]), torch.float32, name)
    for index, (one, other) in enumerate(zip(first, atomic)):
        if index not in (3, 4):
            assert torch.equal(one, other), index
    if device == "cuda" and projections == "grouped":
        wide_n = make_arguments(device, torch.float32, False, "grouped", "grouped", length=9, batch=1, n=129, groups=1)[0]
        wide_args = [wide_n[name] for name in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
        wide_out, wide_checkpoints, _ = torch.ops.linrec.selective_scan_forward(*wide_args, True, None, None)
        with pytest.raises(ValueError, match=r"deterministic sums of a varying B's or C's gradient on the GPU need .* "
                                             r"n <= 128 and a float32 state, got n = 129"):
            torch.ops.linrec.selective_scan_backward(torch.ones_like(wide_out), None, *wide_args, True, None, None,
                                                     wide_checkpoints, deterministic=True)


def test_deterministic_mode_matches_the_loop(device, seed):
    """Under torch.use_deterministic_algorithms(True): lane-kernel calls (B and C varying with the same groups)
    (n = 16 and 100) and others (n above 128, which take the composed scan on the GPU) against the loop."""
    torch.use_deterministic_algorithms(True)
    for n, complex_A in ((16, False), (100, False), (129, False), (16, True)):
        arguments, options = make_arguments(device, torch.float32, complex_A, "grouped", "grouped", length=600,
                                            batch=1, n=n, groups=2)
        check_against_loop(arguments, options)


@pytest.mark.parametrize("empty", ["batch", "d", "n", "length"])
def test_deterministic_mode_with_an_empty_dim(device, seed, empty):
    """Under torch.use_deterministic_algorithms(True), a call with an empty batch, channel, state or time dim:
    the loop's results and gradients (zeros, or the initial state's), no launch of zero blocks."""
    sizes = dict(batch=2, d=4, n=3, length=5) | {empty: 0}
    torch.use_deterministic_algorithms(True)
    arguments, options = make_arguments(device, torch.float32, False, "grouped", "grouped", groups=1, **sizes)
    arguments["initial"] = random_values((sizes["batch"], sizes["d"], sizes["n"]), torch.float32, device)
    check_against_loop(arguments, options)


def test_state_dim_beyond_shared_memory(device, seed):
    """A state dim whose backward's block needs more shared memory than the GPU has: a ValueError naming n and
    the largest n this call takes, before any launch (the forward, which needs less, runs)."""
    if device != "cuda":
        pytest.skip("the CPU has no shared-memory limit")
    arguments, options = make_arguments(device, torch.float32, False, "fixed", "fixed", length=7, batch=1, d=2,
                                        n=1 << 14)
    leaves = {name: tensor.requires_grad_() for name, tensor in arguments.items() if tensor is not None}
    out = linrec.selective_scan(**leaves, **options)
    with pytest.raises(ValueError, match=r"the state dim n = 16384 needs \d+ bytes of shared memory per block, more "
                                         r"than this GPU's \d+: this call takes n <= \d+ here"):
        torch.autograd.grad(out.sum(), list(leaves.values()))


@pytest.mark.parametrize("name", ["u", "delta", "B", "C", "z", "D", "delta_bias", "initial"])
@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan")], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("delta_softplus", [True, False], ids=["softplus", "plain"])
@pytest.mark.parametrize("n", [3, 6, 21])
def test_odd_values_in_the_lane_kernels(device, seed, name, value, delta_softplus, n):
    """An infinite or NaN value in one argument of a float32 call with B and C varying (the GPU's lane kernels):
    outputs and last state infinite and NaN where the float64 loop's are, with its signs, the rest close. The
    state sizes leave the lanes' policies state dims past n: a whole lane of one state dim (n = 3), part of a
    lane of four (6), and both (21 on eight lanes of four), whose states an infinite dt or dt u turns NaN."""
    arguments, options = make_arguments(device, torch.float32, False, "grouped", "grouped", length=40, batch=1, d=4,
                                        n=n, groups=2, delta_softplus=delta_softplus)
    arguments["initial"] = random_values((1, 4, n), torch.float32, device)
    target = arguments[name]
    if target.dim() == 1:
        target[1] = value
    elif name in ("B", "C"):
        target[0, 1, 2, 7] = value
    elif name == "initial":
        target[0, 1, 2] = value
    else:
        target[0, 1, 7] = value
    out, state = linrec.selective_scan(**arguments, **options, return_last_state=True)
    expected_out, expected_state = loop_reference(**{key: wide(tensor) for key, tensor in arguments.items()}, **options)
    for what, actual, expected in (("out", out, expected_out), ("last state", state, expected_state)):
        actual = actual.cpu().double()
        for kind in (torch.isnan, lambda t: t == float("inf"), lambda t: t == -float("inf")):
            assert torch.equal(kind(actual), kind(expected)), f"{what}: non-finite values differ from the loop's"
        finite = torch.isfinite(expected)
        if finite.any():
            assert_matches(actual[finite], expected[finite], torch.float32, what)
