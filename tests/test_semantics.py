"""The recurrence's IEEE answer whatever the values: non-finite values, packed boundaries, single
steps, isolation of rows and packed sequences. The reference is the sequential loop run in the
kernels' compute dtype (float32 for the 16-bit types and float32, float64 for float64): it decides where
results are NaN and +-Inf; finite results are compared with the float64 loop."""

from __future__ import annotations

import pytest
import torch

import linrec
from linrec.reference import compute_dtype
from helpers import (
    TOLERANCE,
    TRITON_DEVICES,
    TRITON_ON_GPU,
    random_values,
    triton_runs_on,
    use_instruction_set,
    wide,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def loop(inputs, coeffs, dtype, *, leaves_dtype=None, **kwargs):
    """The loop reference on the CPU in `dtype`, from the given (already rounded) values."""
    cast = lambda t: None if t is None else t.detach().cpu().to(dtype)  # noqa: E731
    kwargs = dict(kwargs)
    if kwargs.get("initial") is not None:
        kwargs["initial"] = cast(kwargs["initial"])
    if kwargs.get("cu_seqlens") is not None:
        kwargs["cu_seqlens"] = kwargs["cu_seqlens"].cpu()
    return linrec.linrec(cast(inputs), cast(coeffs), backend="loop", **kwargs)


def loop_gradients(d_outputs, inputs, coeffs, dtype, **kwargs):
    """Autograd through the loop in `dtype`: the gradients of inputs, coeffs and initial (if given)."""
    initial = kwargs.pop("initial", None)
    leaves = [t.detach().cpu().to(dtype).requires_grad_() for t in (inputs, coeffs, initial) if t is not None]
    cu_seqlens = kwargs.pop("cu_seqlens", None)
    outputs = linrec.linrec(leaves[0], leaves[1], backend="loop", initial=leaves[2] if initial is not None else None,
                            cu_seqlens=None if cu_seqlens is None else cu_seqlens.cpu(), **kwargs)
    return torch.autograd.grad(outputs, leaves, d_outputs.detach().cpu().to(dtype), allow_unused=True,
                               materialize_grads=True)


def assert_recurrence(actual: torch.Tensor, pattern: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, what: str,
                      scale: torch.Tensor | None = None, nan_for_inf: bool = False, tolerance_factor: float = 4.0):
    """`actual` is NaN exactly where `pattern` (the loop in the compute dtype, rounded to `dtype`) is, +-Inf
    where it is +-Inf, and elsewhere within the dtype's tolerance of `exact` (the float64 loop), relative to
    max |exact| or, for a sum of terms each rounded to the dtype, to the largest sum of |terms| (`scale`).
    `nan_for_inf`: NaN is accepted where the loop has +-Inf (the GPU's summed coefficient gradients)."""
    actual = actual.detach().cpu()
    pattern = pattern.to(dtype).to(exact.dtype)
    actual_wide = actual.to(exact.dtype)
    if exact.is_complex():  # the real and imaginary parts, each a real result
        actual_wide, pattern, exact = (torch.view_as_real(t.resolve_conj()) for t in (actual_wide, pattern, exact))
        scale = None if scale is None else scale.unsqueeze(-1).expand(exact.shape)
    if nan_for_inf:
        actual_wide = torch.where(torch.isnan(actual_wide) & torch.isinf(pattern), pattern, actual_wide)
    # Within rounding of the largest finite value, overflow is decided by the last bit: either answer is
    # the loop's up to rounding.
    largest = torch.finfo(dtype).max if not dtype.is_complex else torch.finfo(torch.float32 if dtype == torch.complex64 else torch.float64).max
    borderline = (exact.abs() >= largest * (1 - 8 * TOLERANCE[dtype])) & (
        torch.isinf(pattern) | torch.isinf(actual_wide)) & ~torch.isnan(pattern) & ~torch.isnan(actual_wide)
    actual_wide = torch.where(borderline, pattern, actual_wide)
    for name, test in (("NaN", torch.isnan), ("+Inf", torch.isposinf), ("-Inf", torch.isneginf)):
        mismatch = test(actual_wide) != test(pattern)
        if mismatch.any():
            where = mismatch.nonzero()[:5].tolist()
            raise AssertionError(f"{what}: {name} differs from the loop at {mismatch.sum().item()} elements, "
                                 f"e.g. {where}: got {[actual_wide[tuple(i)].item() for i in where]}, "
                                 f"loop {[pattern[tuple(i)].item() for i in where]}")
    finite = torch.isfinite(pattern) & torch.isfinite(exact)
    if finite.any():
        magnitudes = exact.abs() if scale is None else scale
        scale = magnitudes[finite & torch.isfinite(magnitudes)].max().clamp_min(1e-30) if (finite & torch.isfinite(magnitudes)).any() else 1.0
        error = ((actual_wide[finite] - exact[finite]).abs().max() / scale).item()
        assert error <= tolerance_factor * TOLERANCE[dtype], f"{what}: max error / max |ref| = {error:.3g} ({dtype})"


def check(inputs, coeffs, device, backend="auto", grad=True, tolerance_factor=4.0, **kwargs):
    """Outputs and gradients of one call against the loop, NaN/Inf pattern and values (within
    tolerance_factor times the dtype's tolerance)."""
    dtype = inputs.dtype
    inputs, coeffs = inputs.to(device), coeffs.to(device)
    kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    leaves = [t.detach().clone().requires_grad_(grad) for t in (inputs, coeffs, kwargs.get("initial")) if t is not None]
    call = dict(kwargs, initial=leaves[2] if len(leaves) > 2 else None)
    outputs = linrec.linrec(leaves[0], leaves[1], backend=backend, **call)
    wide_dtype = torch.complex128 if dtype.is_complex else torch.float64
    assert_recurrence(outputs, loop(inputs, coeffs, compute_dtype(dtype), **kwargs),
                      loop(inputs, coeffs, wide_dtype, **kwargs), dtype, "outputs", tolerance_factor=tolerance_factor)
    if not grad:
        return outputs
    d_outputs = random_values(inputs.shape, dtype, device)
    grads = torch.autograd.grad(outputs, leaves, d_outputs, allow_unused=True, materialize_grads=True)
    patterns = loop_gradients(d_outputs, inputs, coeffs, compute_dtype(dtype), **kwargs)
    exacts = loop_gradients(d_outputs, inputs, coeffs, wide_dtype, **kwargs)
    for name, actual, pattern, exact in zip(("d_inputs", "d_coeffs", "d_initial"), grads, patterns, exacts):
        scale, summed_on_gpu = None, False
        if name == "d_coeffs" and coeffs.shape != inputs.shape:  # a sum over the broadcast dims
            terms = loop_gradients(d_outputs, inputs, coeffs.expand(inputs.shape), wide_dtype, **kwargs)[1]
            scale = terms.abs().sum_to_size(coeffs.shape)
            summed_on_gpu = backend == "triton" or device != "cpu"
        assert_recurrence(actual, pattern, exact, dtype, name, scale, nan_for_inf=summed_on_gpu,
                          tolerance_factor=tolerance_factor)
    return outputs


def uniform(shape, low, high, dtype=torch.float32):
    return (low + (high - low) * torch.rand(shape, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("length", [50, 4097, 5000])
@pytest.mark.parametrize("where", ["inputs", "coeffs"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinity_stays(device, seed, length, where, value):
    """An infinite input or coefficient keeps every later state infinite, with the loop's sign."""
    inputs, coeffs = torch.randn(2, length), uniform((2, length), 0.5, 1.0)
    (inputs if where == "inputs" else coeffs)[1, length // 3] = value
    outputs = check(inputs, coeffs, device)
    assert torch.isinf(outputs[1, length // 3:]).all()
    assert torch.isfinite(outputs[0]).all() and torch.isfinite(outputs[1, :length // 3]).all()


@pytest.mark.parametrize("shape", [(4, 50), (4, 4097), (4, 70000)])
@pytest.mark.parametrize("where", ["inputs", "coeffs"])
@pytest.mark.parametrize("reverse", [False, True])
def test_nan_spreads_forward_only(device, seed, shape, where, reverse):
    """A NaN makes every later step of its row NaN and changes no bit of any other output."""
    inputs, coeffs = torch.randn(shape), uniform(shape, 0.5, 1.0)
    clean = linrec.linrec(inputs.to(device), coeffs.to(device), reverse=reverse).cpu()
    position = shape[1] // 2 + 1
    (inputs if where == "inputs" else coeffs)[2, position] = float("nan")
    outputs = check(inputs, coeffs, device, grad=shape[1] < 10000, reverse=reverse)
    later = slice(0, position + 1) if reverse else slice(position, None)
    earlier = slice(position + 1, None) if reverse else slice(0, position)
    assert torch.isnan(outputs[2, later]).all()
    assert torch.equal(outputs[2, earlier].cpu(), clean[2, earlier])
    rows = [0, 1, 3]
    assert torch.equal(outputs[rows].cpu(), clean[rows])


@pytest.mark.parametrize("shape, dim", [((3, 5000), -1), ((2, 70001), -1), ((700, 300), -1), ((2, 3000, 40), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reverse", [False, True])
def test_states_past_an_infinity(device, seed, shape, dim, dtype, reverse):
    """Past an infinite state the loop keeps an infinity whose sign follows the signs of the coefficients,
    until a zero or NaN coefficient, a NaN input or an infinity of the other sign makes it NaN. Sparse
    non-finite values over coefficients of both signs, on every kernel family (chained few long rows,
    pipes, strided time), outputs and gradients, and gradients that flow in infinite."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(shape, generator=generator, dtype=torch.float64)
    coeffs = torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    for values, density in ((inputs, 2e-4), (coeffs, 1e-4)):
        picks = torch.rand(shape, generator=generator) < density
        values[picks] = specials[torch.randint(0, 4, shape, generator=generator)][picks].double()
    inputs[(0,) * (len(shape) - 1)] = float("inf")  # one row infinite from its first step (or last, reversed)
    inputs, coeffs = inputs.to(dtype), coeffs.to(dtype)
    check(inputs, coeffs, device, dim=dim, reverse=reverse, grad=shape[dim] < 10000)
    if shape[dim] >= 10000:
        return  # the loop's gradients take minutes there
    # Infinite and NaN gradients flowing in.
    leaves = [t.to(device).requires_grad_() for t in (inputs, coeffs)]
    outputs = linrec.linrec(*leaves, dim=dim, reverse=reverse)
    d_outputs = torch.randn(shape, generator=generator, dtype=torch.float64)
    d_picks = torch.rand(shape, generator=generator) < 2e-4
    d_outputs[d_picks] = specials[torch.randint(0, 3, shape, generator=generator)][d_picks].double()
    d_outputs = d_outputs.to(dtype)
    grads = torch.autograd.grad(outputs, leaves, d_outputs.to(device))
    patterns = loop_gradients(d_outputs, inputs, coeffs, compute_dtype(dtype), dim=dim, reverse=reverse)
    exacts = loop_gradients(d_outputs, inputs, coeffs, torch.float64, dim=dim, reverse=reverse)
    for name, actual, pattern, exact in zip(("d_inputs", "d_coeffs"), grads, patterns, exacts):
        assert_recurrence(actual, pattern, exact, dtype, name)


@pytest.mark.parametrize("shape, dim", [((6, 700), -1), ((2, 300, 40), 1), ((4, 200, 4096), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("with_initial, reverse", [(False, False), (True, True)])
def test_rows_of_nan(device, seed, shape, dim, dtype, with_initial, reverse):
    """Rows NaN from their first step or from a middle one, by their inputs or a coefficient, beside finite
    rows, on every kernel family (time-contiguous pipes, strided pipes with many channels, the bulk family
    with few): the loop's results, outputs and gradients. Past a NaN state the rescans fill the rest
    without reading it; a zero coefficient there, which the parallel scans take as a reset, must not end
    the NaN (the loop's 0 * NaN)."""
    inputs = torch.randn(shape, dtype=dtype)
    coeffs = uniform(shape, 0.5, 1.0).to(dtype)
    length = shape[dim]
    nan = complex(float("nan"), float("nan")) if dtype.is_complex else float("nan")
    along_rows = lambda t: t.movedim(dim, -1)  # noqa: E731  (a view: rows on the second-to-last dim)
    along_rows(inputs)[..., 0::4, :] = nan
    along_rows(inputs)[..., 1::4, length // 2:] = nan
    along_rows(coeffs)[..., 2::4, length // 3] = nan
    along_rows(coeffs)[..., 2::4, [length // 3 - 1, length // 3 + 1]] = 0
    along_rows(inputs)[..., 3::4, length // 4] = nan
    along_rows(coeffs)[..., 3::4, [length // 4 - 1, length // 4 + 1]] = 0
    initial = torch.randn(along_rows(inputs).shape[:-1], dtype=dtype) if with_initial else None
    outputs = check(inputs, coeffs, device, dim=dim, reverse=reverse, initial=initial)
    assert torch.isnan(along_rows(outputs)[..., 0::4, 1:]).all()


@pytest.mark.parametrize("value", ["overflow", "nan", "inf"])
@pytest.mark.parametrize("reverse", [False, True])
def test_packed_sequences_are_isolated(device, seed, value, reverse):
    """A sequence that overflows, or holds NaN or Inf, changes no bit of the other packed sequences'
    outputs or gradients."""
    cu_seqlens = torch.tensor([0, 10, 10, 300, 301, 1200])
    inputs, coeffs = torch.randn(1, 1200, 3), uniform((1, 1200, 3), 0.5, 1.5)
    initial = torch.randn(5, 3)

    def run(inputs, coeffs):
        leaves = [t.to(device).requires_grad_() for t in (inputs, coeffs, initial)]
        outputs = linrec.linrec(*leaves[:2], dim=1, reverse=reverse, initial=leaves[2], cu_seqlens=cu_seqlens.to(device))
        d_outputs = torch.linspace(-1, 1, 1200 * 3).reshape(1, 1200, 3).to(device)
        return [outputs, *torch.autograd.grad(outputs, leaves, d_outputs)]

    clean = run(inputs, coeffs)
    inputs, coeffs = inputs.clone(), coeffs.clone()
    if value == "overflow":
        inputs[:, 10:300], coeffs[:, 10:300] = 1e3, 3.0
    else:
        inputs[:, 150, 1] = float(value)
    dirty = run(inputs, coeffs)
    for name, a, b in zip(("outputs", "d_inputs", "d_coeffs"), clean, dirty):
        for part in (slice(0, 10), slice(300, 1200)):
            assert torch.equal(a[:, part].cpu(), b[:, part].cpu()), f"{name} of another sequence changed"
    d_initial_clean, d_initial_dirty = clean[3].cpu(), dirty[3].cpu()
    assert torch.equal(d_initial_clean[[0, 1, 3, 4]], d_initial_dirty[[0, 1, 3, 4]])
    assert not torch.isfinite(dirty[0][:, 10:300]).all()
    check(inputs, coeffs, device, dim=1, reverse=reverse, initial=initial, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("coeffs_shape", [(10,), ()])
def test_single_step_coefficient_gradient(device, seed, coeffs_shape):
    """The EMA form at length 1: y = (1 - a) * x + a * x[0], whose gradient in a is exactly 0."""
    x = torch.randn(3, 1, 10, dtype=torch.float64).float().to(device)
    a = torch.rand(coeffs_shape).to(device).requires_grad_()
    y = linrec.linrec((1 - a) * x, a, dim=1, initial=x[:, 0])
    (d_a,) = torch.autograd.grad(y, a, torch.randn_like(y))
    d_a64 = wide(d_a)
    scale = x.abs().max().item() * 3
    assert d_a64.abs().max().item() <= 1e-6 * scale, d_a


@pytest.mark.parametrize("length", [0, 1, 2, 3, 15, 16, 17, 127, 128, 129, 2047, 2048, 2049])
@pytest.mark.parametrize("layout", ["time_last", "btc"])
@pytest.mark.parametrize("coeffs_kind", ["full", "channel", "scalar", "row"])
def test_gradients_at_every_length(device, seed, length, layout, coeffs_kind):
    """Gradients at lengths 0, 1, 2 and around tile sizes, every coeffs shape, with initial."""
    shape = (2, 6, length) if layout == "time_last" else (2, length, 6)
    dim = -1 if layout == "time_last" else 1
    channel_shape = (6, 1) if layout == "time_last" else (6,)
    row_shape = (2, 1, length) if layout == "time_last" else (2, length, 1)
    coeffs_shape = {"full": shape, "channel": channel_shape, "scalar": (), "row": row_shape}[coeffs_kind]
    inputs, coeffs = torch.randn(shape), uniform(coeffs_shape, -1.0, 1.0)
    initial = torch.randn(2, 6)
    check(inputs, coeffs, device, dim=dim, initial=initial)
    check(inputs, coeffs, device, dim=dim, reverse=True)


#: (inputs' shape for sequences of `length` steps, dim, packed): 37 sequences in each layout.
SHORT_LAYOUTS = {
    "time_last": (lambda length: (37, length), -1, False),
    "time_first": (lambda length: (length, 37), 0, False),
    "batch_time_channels": (lambda length: (2, length, 19), 1, False),
    "packed_time_last": (lambda length: (1, 37 * length), -1, True),
    "packed_batch_time_channels": (lambda length: (1, 37 * length, 3), 1, True),
}


@pytest.mark.parametrize("length", [0, 1, 2])
@pytest.mark.parametrize("layout", SHORT_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_sequences_on_every_layout(device, seed, dtype, layout, length):
    """Many sequences of 0, 1 or 2 steps in every layout (packed: 37 sequences of that length), with an
    infinite input and a NaN coefficient among them, from an initial state or none, in both directions:
    outputs and gradients follow the loop."""
    shape_of, dim, packed = SHORT_LAYOUTS[layout]
    shape = shape_of(length)
    inputs, coeffs = random_values(shape, dtype), uniform(shape, -1.0, 1.0, dtype)
    if inputs.numel() > 0:
        inputs.view(-1)[inputs.numel() // 3] = float("inf")
        coeffs.view(-1)[-1] = float("nan")
    cu_seqlens = torch.arange(38, dtype=torch.int32) * length if packed else None
    state_shape = [size for d, size in enumerate(shape) if d != dim % len(shape)]
    if packed:
        state_shape[0] = 37
    for reverse in (False, True):
        check(inputs, coeffs, device, dim=dim, reverse=reverse, cu_seqlens=cu_seqlens)
        check(inputs, coeffs, device, dim=dim, reverse=reverse, cu_seqlens=cu_seqlens,
              initial=random_values(state_shape, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_exact_zero_and_one(device, seed, dtype):
    """Coefficients exactly 0 (resets) and 1 (running sums), and infinite and NaN states around them."""
    inputs = torch.randn(3, 300).to(dtype)
    coeffs = torch.where(torch.rand(3, 300) < 0.5, 1.0, 0.0).to(dtype)
    inputs[1, 100] = float("inf")
    coeffs[2, 200] = float("nan")
    check(inputs, coeffs, device)
    check(inputs, coeffs, device, reverse=True)


# Rows short enough for Triton's interpreter (a launch of these checks takes seconds there), long enough for
# several 16-element tiles past each special value.
TRITON_INTERPRETED_LENGTH = 150


@pytest.mark.parametrize("triton_device", TRITON_DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_follows_the_loop(triton_device, seed, reverse):
    """The Triton kernels: infinity kept, NaN spread, resets that isolate packed sequences, each program
    rescanning the rows it scanned."""
    _triton_follows_the_loop(triton_device, reverse)


@pytest.mark.parametrize("triton_device", TRITON_DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_follows_the_loop_in_split_rows(triton_device, seed, monkeypatch, reverse):
    """The same with every row split into segments (16-element tiles, the split threshold raised): the
    segments' maps carry non-finite states and underflowed products, and the rescan kernels read the flags
    of every segment."""
    from linrec._core.triton import configs, launch
    from linrec._core.triton.layout import plan

    monkeypatch.setattr(configs, "TILE_ELEMENTS", 16)
    monkeypatch.setattr(configs, "SPLIT_BELOW_PROGRAMS_PER_MULTIPROCESSOR", 1 << 20)
    launch._plan.cache_clear()
    monkeypatch.setattr(launch, "_plan", launch._plan.__wrapped__)  # no plan cached under these settings
    for shape, dim in (((3, TRITON_INTERPRETED_LENGTH), 1), ((1, TRITON_INTERPRETED_LENGTH, 4), 1)):
        layout = plan(shape, dim, (torch.empty(shape).stride(),))
        assert launch._plan(layout, torch.float32, torch.device(triton_device), 0, 0).segments > 1
    _triton_follows_the_loop(triton_device, reverse)


def _triton_follows_the_loop(triton_device, reverse):
    length = TRITON_INTERPRETED_LENGTH
    inputs, coeffs = torch.randn(3, length), uniform((3, length), 0.5, 1.0)
    coeffs[0, 100] = float("inf")
    inputs[1, 77] = float("-inf")
    coeffs[2, 120] = float("nan")
    check(inputs, coeffs, triton_device, backend="triton", reverse=reverse)
    nan_rows = inputs.clone()  # a row NaN throughout, one from its middle: the rest filled past a NaN state
    nan_rows[0], nan_rows[1, length // 2:], nan_rows[2, 40] = float("nan"), float("nan"), float("nan")
    coeffs = coeffs.clone()
    coeffs[2, [39, 41]] = 0  # a reset to the parallel scans, not to the loop past a NaN state
    check(nan_rows, coeffs, triton_device, backend="triton", reverse=reverse, initial=torch.randn(3))
    check(nan_rows, coeffs.log(), triton_device, backend="triton", reverse=reverse, log_coeffs=True)
    tiny = uniform((3, length), 1e-3, 2e-3)  # products underflow within a tile
    check(inputs, tiny, triton_device, backend="triton", reverse=reverse)
    cu_seqlens = torch.tensor([0, 10, 10, 120, 121, length])
    packed_inputs, packed_coeffs = torch.randn(1, length, 4), uniform((1, length, 4), 0.5, 1.5)
    packed_inputs[:, 10:120], packed_coeffs[:, 10:120] = 1e3, 3.0
    outputs = check(packed_inputs, packed_coeffs, triton_device, backend="triton", dim=1, reverse=reverse,
                    initial=torch.randn(5, 4), cu_seqlens=cu_seqlens)
    assert torch.isfinite(outputs[:, 120:]).all() and torch.isfinite(outputs[:, :10]).all()


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("reverse", [False, True])
def test_first_coefficient_gradient_with_an_infinite_log_coefficient(device, seed, backend, reverse):
    """A sequence's first coefficient multiplies the zero state (no initial): its gradient is 0, also where
    the coefficient is infinite (a log coefficient of +Inf, where c * d log c would be 0 * Inf), in rows
    and in packed sequences."""
    if backend == "triton" and not triton_runs_on(device):
        pytest.skip("needs triton: on a GPU, or on its interpreter (TRITON_INTERPRET=1)")
    inputs, coeffs = torch.randn(2, 3, 9), uniform((2, 3, 9), -2.0, 0.0)
    coeffs[..., -1 if reverse else 0] = float("inf")
    check(inputs, coeffs, device, backend=backend, reverse=reverse, log_coeffs=True)
    cu_seqlens = torch.tensor([0, 7, 7, 25, 40])
    packed_inputs, packed_coeffs = torch.randn(1, 40, 3), uniform((1, 40, 3), -2.0, 0.0)
    packed_coeffs[:, [6, 24, 39] if reverse else [0, 7, 25]] = float("inf")
    check(packed_inputs, packed_coeffs, device, backend=backend, dim=1, reverse=reverse, log_coeffs=True,
          cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("shape,dim,chained", [((2, 1 << 20), -1, True), ((1, 1 << 17, 64), 1, True),
                                               ((4096, 300), -1, False), ((64, 300, 1024), 1, False)])
def test_results_are_reproducible(device, seed, shape, dim, chained):
    """The same call gives the same bits every time, forward and backward: long sequences split across
    threads on the CPU and chained across blocks on the GPU (whose look-back composes in a fixed order)
    included. Decays near 1 keep the chunks' maps from becoming constant, so the look-back composes."""
    inputs, coeffs = torch.randn(shape, device=device), uniform(shape, 0.999, 1.0).to(device)
    d_outputs = torch.randn(shape, device=device)
    runs = []
    for _ in range(6):
        outputs = torch.ops.linrec.forward(inputs, coeffs, dim)
        runs.append((outputs, *torch.ops.linrec.backward(d_outputs, coeffs, outputs, dim)[:2]))
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            assert torch.equal(first, again)


@pytest.mark.parametrize("coeffs_shape", [(6,), (), (3, 1000, 1)])
def test_deterministic_algorithms_sum_in_a_fixed_order(device, seed, coeffs_shape):
    """Under torch.use_deterministic_algorithms(True), broadcast coefficients' gradient is the same bits
    from run to run, and agrees with the default (atomic on the GPU) sum."""
    inputs = torch.randn(3, 1000, 6, device=device)
    coeffs = uniform(coeffs_shape, 0.5, 1.0).to(device).requires_grad_()
    d_outputs = torch.randn_like(inputs)

    def gradient():
        outputs = linrec.linrec(inputs, coeffs, dim=1)
        return torch.autograd.grad(outputs, coeffs, d_outputs)[0]

    torch.use_deterministic_algorithms(False)
    default = gradient()
    torch.use_deterministic_algorithms(True)
    try:
        fixed = [gradient() for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)
    assert all(torch.equal(fixed[0], again) for again in fixed[1:])
    assert torch.allclose(fixed[0], default, rtol=1e-4, atol=1e-3)


def sequential_loop(inputs: torch.Tensor, coeffs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """y[l] = c[l] * y[l-1] + x[l], step after step in `dtype` on the CPU: time-strided operands, which the
    CPU kernels scan with the loop over time for all channels at once (one fused multiply-add a step)."""
    time_first = lambda t: t.expand_as(inputs).detach().cpu().to(dtype).T.contiguous()  # noqa: E731
    return torch.ops.linrec.forward(time_first(inputs), time_first(coeffs), 0).T


#: One decay per row, from an EMA's usual range up to 1: the longer an output remembers, the more
#: carries (from tile to tile, block to block) its error passes through.
DECAYS = [0.999, 0.9999, 0.99999, 0.999999, 1.0]


@pytest.mark.parametrize("coeffs_kind", ["per row", "expanded", "per step"])
@pytest.mark.parametrize("rows", [len(DECAYS) + 3, 640])
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_float32_accuracy_with_decays_near_one(device, seed, coeffs_kind, rows, backend):
    """float32 on long rows with coefficients in [0.999, 1]: the error against the float64 loop is at
    most 3x the sequential float32 loop's (relative to each row's largest output), with one decay a row
    (broadcast along time or expanded) and with a new coefficient at every step. A few rows are chained
    across blocks on the GPU, many run in pipes."""
    if backend == "triton" and not (device == "cuda" and TRITON_ON_GPU):
        pytest.skip("Triton at this length runs compiled on a GPU only")
    length = (1 << 24 if rows < 100 else 1 << 16) if device == "cuda" else (1 << 18 if rows < 100 else 1 << 12)
    check_accuracy_with_decays_near_one(device, coeffs_kind, rows, length, backend)


def check_accuracy_with_decays_near_one(device, coeffs_kind, rows, length, backend="auto"):
    """float32 on (rows, length) with coefficients in [0.999, 1] (DECAYS first, one a row or one a step):
    the error against the float64 loop is at most 3x the sequential float32 loop's, relative to each
    row's largest output."""
    if coeffs_kind == "per step":
        coeffs = uniform((rows, length), 0.999, 1.0)
    else:
        decays = torch.cat([torch.tensor(DECAYS), uniform((rows - len(DECAYS),), 0.999, 1.0)])[:rows, None]
        coeffs = decays if coeffs_kind == "per row" else decays.expand(rows, length).contiguous()
    inputs = torch.randn(rows, length)
    exact = sequential_loop(inputs, coeffs, torch.float64)
    scale = exact.abs().amax(dim=1, keepdim=True)
    error = lambda outputs: ((outputs.cpu().double() - exact).abs() / scale).amax().item()  # noqa: E731
    loop_error = error(sequential_loop(inputs, coeffs, torch.float32))
    outputs = linrec.linrec(inputs.to(device), coeffs.to(device), backend=backend)
    assert error(outputs) <= 3 * loop_error, f"error {error(outputs):.3g}, the float32 loop's {loop_error:.3g}"


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
def test_float32_accuracy_on_every_instruction_set(seed, monkeypatch, isa):
    """The bound above on the CPU kernels of every vector width (LINREC_CPU_ISA; sets the CPU lacks are
    skipped): the 16-byte ones (SSE2, and NEON on aarch64) have no fused multiply-add to take a
    product's rounding error from, and must not lose the compensation for it."""
    use_instruction_set(monkeypatch, isa)
    check_accuracy_with_decays_near_one("cpu", "per row", 640, 1 << 12)


# --- last_states: the state each sequence ends in -----------------------------------------------------------

# Empty sequences first, in the middle (twice in a row) and last; one of a single step.
OFFSETS = [0, 0, 4, 4, 4, 5, 9, 9]


def _expected_last_states(outputs, offsets, dim, reverse, initial):
    """Each sequence's last output along dim (its first with reverse), or its initial row (zeros) when empty."""
    states = []
    for sequence, (begin, end) in enumerate(zip(offsets, offsets[1:])):
        if begin == end:
            empty = torch.zeros_like(outputs.select(dim, 0).squeeze(0)) if initial is None else initial[sequence]
            states.append(empty)
        else:
            states.append(outputs.select(dim, begin if reverse else end - 1).squeeze(0))
    return torch.stack(states)


@pytest.mark.parametrize("shape, dim", [((1, 9), 1), ((1, 9, 3), 1), ((1, 2, 9), 2), ((1, 2, 9, 3), -2)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_initial", [False, True])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_last_states_of_packed_sequences(device, seed, shape, dim, reverse, with_initial, offsets_dtype):
    inputs, coeffs = random_values(shape, torch.float64, device), uniform(shape, 0.5, 1.0, torch.float64).to(device)
    cu_seqlens = torch.tensor(OFFSETS, dtype=offsets_dtype, device=device)
    state_shape = [len(OFFSETS) - 1, *[size for d, size in enumerate(shape[1:], 1) if d != dim % len(shape)]]
    initial = random_values(state_shape, torch.float64, device) if with_initial else None
    outputs = linrec.linrec(inputs, coeffs, dim=dim, reverse=reverse, initial=initial, cu_seqlens=cu_seqlens)
    states = linrec.last_states(outputs, cu_seqlens, dim=dim, reverse=reverse, initial=initial)
    expected = _expected_last_states(outputs, OFFSETS, dim % len(shape), reverse, initial)
    assert states.shape == tuple(state_shape)
    torch.testing.assert_close(states, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("split", [0, 3, 10])
def test_last_states_continue_the_recurrence(device, seed, dim, reverse, split):
    """Without cu_seqlens every row is a sequence: the last states of the scan's first `split` steps, passed
    as the initial state of the rest, continue the recurrence (an empty first chunk's are zeros)."""
    shape = [4, 5]
    shape[dim] = 10
    inputs, coeffs = random_values(shape, torch.float64, device), uniform(shape, 0.5, 1.0, torch.float64).to(device)
    whole = linrec.linrec(inputs, coeffs, dim=dim, reverse=reverse)
    first_start, rest_start = (10 - split, 0) if reverse else (0, split)
    first = [tensor.narrow(dim, first_start, split) for tensor in (inputs, coeffs)]
    rest = [tensor.narrow(dim, rest_start, 10 - split) for tensor in (inputs, coeffs)]
    state = linrec.last_states(linrec.linrec(*first, dim=dim, reverse=reverse), dim=dim, reverse=reverse)
    assert state.shape == tuple(size for d, size in enumerate(shape) if d != dim % 2)
    tail = linrec.linrec(*rest, dim=dim, reverse=reverse, initial=state)
    torch.testing.assert_close(tail, whole.narrow(dim, rest_start, 10 - split))


def test_last_states_of_empty_outputs_are_the_initial_states(device):
    initial = torch.randn(3, 2, device=device)
    outputs = torch.empty(1, 0, 2, device=device)
    cu_seqlens = torch.zeros(4, dtype=torch.int64, device=device)
    assert torch.equal(linrec.last_states(outputs, cu_seqlens, dim=1, initial=initial), initial)
    assert torch.equal(linrec.last_states(outputs, cu_seqlens, dim=1), torch.zeros(3, 2, device=device))
    assert torch.equal(linrec.last_states(torch.empty(3, 0, 2, device=device), dim=1), torch.zeros(3, 2, device=device))
    # In outputs' dtype, in memory of their own.
    state = linrec.last_states(outputs.bfloat16(), cu_seqlens, dim=1, initial=initial)
    assert state.dtype == torch.bfloat16 and state.data_ptr() != initial.data_ptr()


def test_last_states_gradients(device, seed):
    outputs = random_values((1, 9, 2), torch.float64, device, requires_grad=True)
    initial = random_values((7, 2), torch.float64, device, requires_grad=True)
    cu_seqlens = torch.tensor(OFFSETS, device=device)
    assert torch.autograd.gradcheck(
        lambda outputs, initial: linrec.last_states(outputs, cu_seqlens, dim=1, initial=initial), (outputs, initial))


@pytest.mark.parametrize("call, error, message", [
    (lambda y: linrec.last_states(torch.tensor(1.0)), ValueError, r"outputs must have at least one dim"),
    (lambda y: linrec.last_states(y, dim=3), IndexError, r"dim must be in \[-3, 2\] for a 3-dim tensor, got 3"),
    (lambda y: linrec.last_states(y, dim=1.0), TypeError, r"dim must be an int, got float"),
    (lambda y: linrec.last_states(y, reverse=1), TypeError, r"reverse must be a bool, got int"),
    (lambda y: linrec.last_states(y, [0, 9], dim=1), TypeError, r"cu_seqlens must be a torch.Tensor, got list"),
    (lambda y: linrec.last_states(y, torch.tensor([[0, 9]]), dim=1), ValueError,
     r"cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape \[1, 2\]"),
    (lambda y: linrec.last_states(y, torch.tensor([0, 4, 8]), dim=1), ValueError,
     r"cu_seqlens must end at the length of the time dim \(9\), got 8"),
    (lambda y: linrec.last_states(y, torch.tensor([0, 5, 4, 9]), dim=1), ValueError, r"cu_seqlens must be non-decreasing"),
    (lambda y: linrec.last_states(y[0], torch.tensor([0, 9]), dim=0), ValueError,
     r"with cu_seqlens, outputs packs its sequences along dim 0 .* x.unsqueeze\(0\) with dim=1$"),
    (lambda y: linrec.last_states(y, torch.tensor([0, 9]), dim=1, initial=torch.zeros(2, 2)), ValueError,
     r"initial must have shape \[1, 2\] \(the shape of outputs without the time dim, dim 0 counting the cu_seqlens "
     r"sequences\), got \[2, 2\]"),
    (lambda y: linrec.last_states(y, dim=1, initial=torch.zeros(1, 2, dtype=torch.float64)), TypeError,
     r"initial must have the dtype of outputs \(torch.float32\), got torch.float64"),
    (lambda y: linrec.last_states(y, dim=1, initial=torch.zeros(1, 2, device="meta")), ValueError,
     r"initial must be on the device of outputs \(cpu\), got meta"),
])
def test_last_states_errors(call, error, message):
    with pytest.raises(error, match="^linrec.last_states: " + message):
        call(torch.zeros(1, 9, 2))


def test_scan_docstring_examples():
    import doctest
    import linrec.scan

    assert doctest.testmod(linrec.scan, extraglobs={"torch": torch}, raise_on_error=True).attempted > 0


def test_last_states_compile(device, seed):
    """torch.compile traces last_states whole (the offsets' values are checked in eager mode only)."""
    outputs, initial = torch.randn(1, 9, 2, device=device), torch.randn(7, 2, device=device)
    cu_seqlens = torch.tensor(OFFSETS, device=device)
    compiled = torch.compile(linrec.last_states, fullgraph=True)
    expected = linrec.last_states(outputs, cu_seqlens, dim=1, initial=initial)
    assert torch.equal(compiled(outputs, cu_seqlens, dim=1, initial=initial), expected)
