"""linrec.distributed.linrec against the float64 reference of the whole (concatenated) sequence, across
1, 2 and 3 processes: gloo on the CPU; on GPUs NCCL when every rank has its own GPU, gloo when they share one.

Each world size runs in one set of spawned processes (a process group costs seconds to set up); every rank
runs every case and reports its failures, and each test below asserts one family of cases.
"""

from __future__ import annotations

import json
import os
import random
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import linrec
from helpers import TOLERANCE, assert_matches, random_coeffs, random_values, reference, reference_gradients, wide

WORLD_SIZES = (1, 2, 3)
# Chunk lengths per world size: equal and unequal chunks, a chunk of length 1 and an empty one.
CHUNKS = {1: ((7,), (1,), (0,)), 2: ((5, 3), (1, 6), (0, 4)), 3: ((4, 1, 6), (3, 0, 5), (2, 2, 2))}
DTYPES = (torch.float64, torch.complex128, torch.float32, torch.bfloat16)
# (shape with T for the time dim, dim, coeffs' shape per kind: T is the sequence's length).
LAYOUTS = {
    "time-last": ((3, "T"), -1, {"full": (3, "T"), "per-row": (3, 1), "scalar": ()}),
    "btc": ((2, "T", 4), 1, {"full": (2, "T", 4), "per-channel": (4,), "per-step": (2, "T", 1)}),
    "one-sequence": (("T",), 0, {"full": ("T",), "scalar": ()}),
}
# Mixed precision: the arguments made float32 where the inputs are 16-bit.
MIXES = (("coeffs",), ("initial",), ("coeffs", "initial"))


def _shape(template: tuple, length: int) -> tuple[int, ...]:
    return tuple(length if size == "T" else size for size in template)


def _time_index(tensor: torch.Tensor, dim: int, ndim: int, length: int) -> int | None:
    """Where time is in a tensor that broadcasts against ndim-dim inputs, None where it broadcasts along time."""
    index = dim % ndim - (ndim - tensor.dim())
    return index if index >= 0 and tensor.shape[index] == length and length != 1 else None


def _chunk(tensor: torch.Tensor, dim: int, ndim: int, chunks: tuple[int, ...], rank: int) -> torch.Tensor:
    """This rank's chunk along time, or the whole tensor where it broadcasts along time (shared by the ranks)."""
    index = _time_index(tensor, dim, ndim, sum(chunks))
    return tensor if index is None else tensor.narrow(index, sum(chunks[:rank]), chunks[rank])


def _summed_over_ranks(gradient: torch.Tensor) -> torch.Tensor:
    """The group's sum, in float64 (complex128), on the CPU (reduced on the device: NCCL takes no CPU tensors)."""
    total = gradient.detach().to(torch.complex128 if gradient.is_complex() else torch.float64)
    dist.all_reduce(total)
    return total.cpu()


def _check_case(device, rank, chunks, dtype, layout, kind, reverse, with_initial, log_coeffs, float32_args, case_seed):
    """Outputs and every gradient of this rank's chunk against the reference of the whole sequence; coeffs and
    initial in float32 where named in float32_args (mixed precision), else in dtype."""
    template, dim, coeff_shapes = LAYOUTS[layout]
    length = sum(chunks)
    shape, coeff_shape = _shape(template, length), _shape(coeff_shapes[kind], length)
    coeffs_dtype, initial_dtype = (torch.float32 if name in float32_args else dtype for name in ("coeffs", "initial"))
    torch.manual_seed(case_seed)  # every rank draws the same whole sequence
    inputs, d_outputs = random_values(shape, dtype), random_values(shape, dtype)
    coeffs = random_coeffs(coeff_shape, coeffs_dtype, min_magnitude=0.5)  # long memory: the state crosses chunks
    if log_coeffs:
        coeffs = coeffs.abs().log()
    state_shape = [s for d, s in enumerate(shape) if d != dim % len(shape)]
    initial = random_values(state_shape, initial_dtype) if with_initial else None
    kwargs = dict(dim=dim, reverse=reverse, initial=initial, log_coeffs=log_coeffs)
    expected = reference(inputs, coeffs, **kwargs)
    expected_grads = reference_gradients(d_outputs, inputs, coeffs, **kwargs)

    ndim = len(shape)
    leaves = [t.to(device).requires_grad_() for t in (_chunk(inputs, dim, ndim, chunks, rank),
                                                      _chunk(coeffs, dim, ndim, chunks, rank), initial) if t is not None]
    outputs = linrec.distributed.linrec(leaves[0], leaves[1], dim=dim, reverse=reverse,
                                        initial=leaves[2] if with_initial else None, log_coeffs=log_coeffs)
    grads = torch.autograd.grad(outputs, leaves, _chunk(d_outputs, dim, ndim, chunks, rank).to(device))
    # Every rank sums the shared gradients before any assertion can stop it: the collectives stay in step.
    names = ("d_inputs", "d_coeffs", "d_initial")
    shared = [name == "d_initial" or _time_index(want, dim, ndim, length) is None
              for name, want in zip(names, expected_grads)]
    actuals = [_summed_over_ranks(grad) if each else wide(grad) for grad, each in zip(grads, shared)]
    assert outputs.dtype == dtype and outputs.device == leaves[0].device
    # Errors are measured against the whole sequence's largest value: with 16-bit dtypes the state crosses each
    # chunk boundary rounded to the dtype, an error relative to the state rather than to the chunk's values.
    tolerance = {**TOLERANCE, torch.bfloat16: 3e-2, torch.float16: 4e-3}  # 16-bit gradients: rounded carries too
    _assert_close("outputs", wide(outputs), _chunk(expected, dim, ndim, chunks, rank), expected, TOLERANCE[dtype])
    for name, grad, leaf, want, actual, each in zip(names, grads, leaves, expected_grads, actuals, shared):
        assert grad.shape == leaf.shape, f"{name}: shape {tuple(grad.shape)} != {tuple(leaf.shape)}"
        assert grad.dtype == leaf.dtype, f"{name}: dtype {grad.dtype} != {leaf.dtype}"
        whole = expected_grads[0] if name == "d_initial" else want  # d_initial = c[0] * d_inputs[0]
        if name == "d_coeffs" and coeffs.shape != inputs.shape:  # a sum of rounded terms: scale by their sizes
            whole = reference_gradients(d_outputs, inputs, coeffs.expand(shape), **kwargs)[1].abs().sum_to_size(coeffs.shape)
        _assert_close(name, actual, want if each else _chunk(want, dim, ndim, chunks, rank), whole, tolerance[dtype])


def _assert_close(name: str, actual: torch.Tensor, want: torch.Tensor, whole: torch.Tensor, tolerance: float) -> None:
    """max |actual - want| / max |whole| within the tolerance, every element finite."""
    assert actual.shape == want.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite elements"
    if want.numel():
        scale = (whole if whole.numel() else want).abs().max().clamp_min(1e-30)
        error = ((actual - want).abs().max() / scale).item()
        assert error <= tolerance, f"{name}: max error / max |reference| = {error:.3g} > {tolerance:.3g}"


def _matching_cases(world):
    for chunks in CHUNKS[world]:
        for dtype in DTYPES:
            for layout, (_, _, kinds) in LAYOUTS.items():
                for kind in kinds:
                    for reverse in (False, True):
                        for with_initial in (False, True):
                            yield chunks, dtype, layout, kind, reverse, with_initial, False, ()
        for dtype in (torch.float16, torch.complex64):  # the other dtypes, on the (batch, time, channels) layout
            for kind in ("full", "per-channel"):
                for reverse in (False, True):
                    yield chunks, dtype, "btc", kind, reverse, True, False, ()
        # Mixed precision: every mix with bfloat16 inputs, float32 coeffs with float16 ones.
        for dtype, mixes in ((torch.bfloat16, MIXES), (torch.float16, MIXES[:1])):
            for mix in mixes:
                for kind in ("full", "per-channel"):
                    for reverse in (False, True):
                        yield chunks, dtype, "btc", kind, reverse, True, False, mix
    for chunks in CHUNKS[world][:2]:  # log coefficients
        for dtype in (torch.float64, torch.float32):
            for kind in ("full", "per-channel"):
                for reverse in (False, True):
                    yield chunks, dtype, "btc", kind, reverse, True, True, ()


def _family_matches(device, rank, world, seed):
    for index, case in enumerate(_matching_cases(world)):
        yield f"chunks={case[0]} {case[1]} {case[2]} coeffs={case[3]} reverse={case[4]} initial={case[5]} " \
              f"log_coeffs={case[6]} float32={case[7]}", \
            lambda case=case, index=index: _check_case(device, rank, *case, seed + index)


def _expect_error(error_type, match, call):
    with pytest.raises(error_type, match=match):
        call()


def _family_errors(device, rank, world, seed):
    """Every rank raises, and the group stays usable: each case is followed by a call that works."""
    dist_linrec = linrec.distributed.linrec
    x = torch.randn(2, 3, 4, device=device, dtype=torch.float64)
    c = torch.rand(2, 3, 4, device=device, dtype=torch.float64)
    mismatch = "do not line up"
    refused = r"rank\(s\) \[1\] of the group refused"
    cases = {
        "channels": (ValueError, mismatch + r": inputs' shape \(2, T, 4\) on rank 0 but \(2, T, 5\)",
                     lambda: dist_linrec(torch.randn(2, 3, 4 + (rank > 0), device=device, dtype=torch.float64),
                                         torch.rand(4 + (rank > 0), device=device, dtype=torch.float64), dim=1)),
        "dtype": (ValueError, mismatch + ": dtype torch.float64 on rank 0 but torch.float32",
                  lambda: dist_linrec(x.float() if rank else x, c.float() if rank else c, dim=1)),
        "coeffs' dtype": (ValueError, mismatch + ": coeffs' dtype torch.bfloat16 on rank 0 but torch.float32",
                          lambda: dist_linrec(x.bfloat16(), c.float() if rank else c.bfloat16(), dim=1)),
        "initial's dtype": (ValueError, mismatch + ": initial's dtype torch.bfloat16 on rank 0 but torch.float32",
                            lambda: dist_linrec(x.bfloat16(), c.float(), dim=1,
                                                initial=x[:, 0].float() if rank else x[:, 0].bfloat16())),
        "dims": (ValueError, mismatch + ": dims of inputs 3 on rank 0 but 2",
                 lambda: dist_linrec(x[0] if rank else x, c[0] if rank else c, dim=0 if rank else 1)),
        "time dim": (ValueError, mismatch + ": time dim 1 on rank 0 but 2",
                     lambda: dist_linrec(x, c, dim=2 if rank else 1)),
        "reverse": (ValueError, mismatch + ": reverse False on rank 0 but True",
                    lambda: dist_linrec(x, c, dim=1, reverse=rank > 0)),
        "initial": (ValueError, mismatch + ": initial given True on rank 0 but False",
                    lambda: dist_linrec(x, c, dim=1, initial=None if rank else x[:, 0])),
        "coeffs kinds": (ValueError, mismatch + r": coeffs' shape \(2, T, 4\) on rank 0 but \(1, 1, 4\)",
                         lambda: dist_linrec(x, c[:1, :1] if rank else c, dim=1)),
        "refused dim": (IndexError if rank == 1 else RuntimeError, "dim must be in" if rank == 1 else refused,
                        lambda: dist_linrec(x, c, dim=5 if rank == 1 else 1)),
        "refused type": (TypeError if rank == 1 else RuntimeError, "coeffs must be a torch.Tensor" if rank == 1 else refused,
                         lambda: dist_linrec(x, [0.5] if rank == 1 else c, dim=1)),
        "refused dtype": (TypeError if rank == 1 else RuntimeError, "coeffs must have the dtype" if rank == 1 else refused,
                          lambda: dist_linrec(x, c.float() if rank == 1 else c, dim=1)),
        "group": (TypeError, "group must be a torch.distributed.ProcessGroup",
                  lambda: dist_linrec(x, c, group="world")),
        "second derivatives": (NotImplementedError, "second derivatives",
                               lambda: torch.autograd.grad(
                                   torch.autograd.grad(dist_linrec(x.requires_grad_(), c, dim=1).square().sum(), x,
                                                       create_graph=True)[0].sum(), x)),
    }
    single = ("group", "second derivatives")  # the others need ranks that differ
    for name, (error_type, match, call) in cases.items():
        if world == 1 and name not in single:
            continue

        def case(error_type=error_type, match=match, call=call):
            _expect_error(error_type, match, call)
            assert dist_linrec(x.detach(), c, dim=1).shape == x.shape  # the group goes on working
        yield name, case


def _family_transforms(device, rank, world, seed):
    """Forward-mode AD, torch.func.grad, torch.compile and opcheck, against the reference of the whole sequence."""
    generator = torch.Generator().manual_seed(seed)
    length, chunks = 3 * world + 1, tuple(3 + (r == 0) for r in range(world))
    inputs = torch.randn(2, length, 3, generator=generator, dtype=torch.float64)
    coeffs = torch.rand(2, length, 3, generator=generator, dtype=torch.float64)
    tangents = [torch.randn(2, length, 3, generator=generator, dtype=torch.float64) for _ in range(2)]
    initial, t_initial = torch.randn(2, 2, 3, generator=generator, dtype=torch.float64).unbind(0)

    def local(tensor):
        return _chunk(tensor, 1, 3, chunks, rank).to(device)

    def whole(x, c, h):
        return linrec.linrec(x, c, dim=1, initial=h, backend="loop")

    def split(x, c, h):
        return linrec.distributed.linrec(x, c, dim=1, initial=h)

    def operands(dtype, coeffs_dtype):
        """(inputs, coeffs, initial) and their tangents: inputs' in dtype, the others in coeffs_dtype (float32
        with 16-bit inputs: mixed precision)."""
        return ((inputs.to(dtype), coeffs.to(coeffs_dtype), initial.to(coeffs_dtype)),
                (tangents[0].to(dtype), tangents[1].to(coeffs_dtype), t_initial.to(coeffs_dtype)))

    def on_rank(x, c, h):
        return local(x), local(c), h.to(device)

    def check_jvp(dtype, coeffs_dtype):
        primals, primal_tangents = operands(dtype, coeffs_dtype)
        widened = [tuple(t.double() for t in each) for each in (primals, primal_tangents)]
        _, expected = torch.func.jvp(whole, *widened)
        _, actual = torch.func.jvp(split, on_rank(*primals), on_rank(*primal_tangents))
        assert actual.dtype == dtype, f"jvp: dtype {actual.dtype} != {dtype}"
        assert_matches(actual, local(expected).cpu(), dtype, "jvp")

    def check_func_grad():
        weights = torch.randn(2, length, 3, generator=generator, dtype=torch.float64)
        expected = torch.func.grad(lambda x, c: (whole(x, c, None) * weights).sum(), argnums=(0, 1))(inputs, coeffs)
        actual = torch.func.grad(lambda x, c: (split(x, c, None) * local(weights)).sum(), argnums=(0, 1))(
            local(inputs), local(coeffs))
        for name, a, e in zip(("d_inputs", "d_coeffs"), actual, expected):
            assert_matches(a, local(e).cpu(), torch.float64, name)

    def check_compile(backend):
        compiled = torch.compile(lambda x, c: split(x, c, None).sin(), fullgraph=True, backend=backend)
        x, c = local(inputs).requires_grad_(), local(coeffs).requires_grad_()
        outputs = compiled(x, c)
        assert_matches(outputs, local(whole(inputs, coeffs, None).sin()).cpu(), torch.float64)
        d_inputs = torch.autograd.grad(outputs.sum(), x)[0]
        leaf = inputs.clone().requires_grad_()
        expected = torch.autograd.grad(whole(leaf, coeffs, None).sin().sum(), leaf)[0]
        assert_matches(d_inputs, local(expected).cpu(), torch.float64, "d_inputs")

    def check_opcheck(dtype, coeffs_dtype):
        group_name = dist.group.WORLD.group_name
        x, c, h = (t.requires_grad_() for t in on_rank(*operands(dtype, coeffs_dtype)[0]))
        torch.library.opcheck(torch.ops.linrec.sequence_parallel_forward.default, (x, c, h, 1, False, False, group_name))
        outputs, carries = torch.ops.linrec.sequence_parallel_forward(x.detach(), c.detach(), h.detach(), 1, False, False,
                                                                   group_name)
        torch.library.opcheck(torch.ops.linrec.sequence_parallel_backward.default,
                              (torch.randn_like(outputs), c.detach(), outputs, h.detach(), carries, 1, False, False,
                               group_name), test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))

    def check_subgroup():
        """A group of the ranks but rank 1, whose ranks number their chunks in the group's order."""
        members = [r for r in range(world) if r != 1] or [0]
        group = dist.new_group(members)  # every rank takes part in creating it
        if rank not in members:
            _expect_error(ValueError, "not a member of group", lambda: linrec.distributed.linrec(
                local(inputs), local(coeffs), dim=1, group=group))
            return
        order = members.index(rank)
        sub_chunks = tuple(chunks[r] for r in members)
        whole_inputs = torch.cat([_chunk(inputs, 1, 3, chunks, r) for r in members], 1)
        whole_coeffs = torch.cat([_chunk(coeffs, 1, 3, chunks, r) for r in members], 1)
        expected = whole(whole_inputs, whole_coeffs, initial)
        actual = linrec.distributed.linrec(local(inputs), local(coeffs), dim=1, initial=initial.to(device), group=group)
        assert_matches(actual, _chunk(expected, 1, 3, sub_chunks, order), torch.float64)

    dtypes = ((torch.float64, torch.float64), (torch.bfloat16, torch.float32))  # inputs', coeffs' and initial's
    for dtype, coeffs_dtype in dtypes:
        yield f"jvp {dtype} coeffs {coeffs_dtype}", lambda dtype=dtype, c=coeffs_dtype: check_jvp(dtype, c)
    yield "subgroup", check_subgroup
    yield "torch.func.grad", check_func_grad
    for dtype, coeffs_dtype in dtypes:
        yield f"opcheck {dtype} coeffs {coeffs_dtype}", lambda dtype=dtype, c=coeffs_dtype: check_opcheck(dtype, c)
    for backend in ("aot_eager", "inductor"):
        yield f"compile {backend}", lambda backend=backend: check_compile(backend)


def _family_nonfinite(device, rank, world, seed):
    """The recurrence's IEEE answer across ranks: an infinite or NaN input or coefficient in the first
    rank's chunk (the last one's with reverse) is NaN, +Inf or -Inf on every later rank exactly where the
    float64 loop over the whole sequence is, forward and backward."""
    chunks = (3, 2, 4)[:world] if world > 1 else (7,)
    length = sum(chunks)
    for where, value in (("inputs", "inf"), ("inputs", "-inf"), ("coeffs", "inf"), ("inputs", "nan"), ("coeffs", "nan")):
        for reverse in (False, True):
            def case(where=where, value=float(value), reverse=reverse):
                generator = torch.Generator().manual_seed(seed)
                inputs = torch.randn(2, length, generator=generator, dtype=torch.float64)
                coeffs = 0.5 + 0.5 * torch.rand(2, length, generator=generator, dtype=torch.float64)
                (inputs if where == "inputs" else coeffs)[1, length - 2 if reverse else 1] = value
                exact = linrec.linrec(inputs.requires_grad_(), coeffs.requires_grad_(), reverse=reverse, backend="loop")
                d_outputs = torch.randn(2, length, generator=generator, dtype=torch.float64)
                exact_grads = torch.autograd.grad(exact, (inputs, coeffs), d_outputs)
                local = [_chunk(t.detach(), -1, 2, chunks, rank).to(device, torch.float32).requires_grad_()
                         for t in (inputs, coeffs)]
                outputs = linrec.distributed.linrec(*local, reverse=reverse)
                grads = torch.autograd.grad(outputs, local, _chunk(d_outputs, -1, 2, chunks, rank).to(device, torch.float32))
                for name, actual, want in zip(("outputs", "d_inputs", "d_coeffs"), (outputs, *grads),
                                              (exact, *exact_grads)):
                    want = _chunk(want.detach(), -1, 2, chunks, rank)
                    actual = actual.detach().cpu().double()
                    for test in (torch.isnan, torch.isposinf, torch.isneginf):
                        assert torch.equal(test(actual), test(want)), f"{name}: {test.__name__} differs from the loop"
                    finite = torch.isfinite(want)
                    assert torch.allclose(actual[finite], want[finite], rtol=1e-4, atol=1e-4), name
            yield f"{where}={value} reverse={reverse}", case
    yield from _extreme_products(device, rank, world, seed, chunks)


def _extreme_products(device, rank, world, seed, chunks):
    """A product of the middle chunk's coefficients that underflows (an infinite state carried through
    tiny coefficients stays infinite) or overflows (a tiny state carried through huge ones stays finite)
    where the loop's states do neither: the float32 loop's answer, outputs and gradients (the underflow)
    or outputs (the overflow, whose gradients overflow in float32 on every path)."""
    length, middle = sum(chunks), slice(3, 5)
    for regime in ("underflow", "overflow"):
        for reverse in (False, True):
            def case(regime=regime, reverse=reverse):
                generator = torch.Generator().manual_seed(seed)
                inputs = torch.randn(2, length, generator=generator)
                coeffs = 0.5 + 0.5 * torch.rand(2, length, generator=generator)
                before = slice(5, length) if reverse else slice(0, 3)  # the chunk before the middle one
                if regime == "underflow":
                    coeffs[:, middle] = 1e-30
                    inputs[1, length - 2 if reverse else 1] = float("inf")
                else:
                    coeffs[:, middle] = 1e25
                    inputs[:, before] *= 1e-30
                exact = linrec.linrec(inputs.requires_grad_(), coeffs.requires_grad_(), reverse=reverse, backend="loop")
                d_outputs = torch.randn(2, length, generator=generator)
                wanted = [exact]
                if regime == "underflow":
                    wanted += torch.autograd.grad(exact, (inputs, coeffs), d_outputs)
                local = [_chunk(t.detach(), -1, 2, chunks, rank).to(device).requires_grad_() for t in (inputs, coeffs)]
                outputs = linrec.distributed.linrec(*local, reverse=reverse)
                found = [outputs, *torch.autograd.grad(outputs, local, _chunk(d_outputs, -1, 2, chunks, rank).to(device))]
                for name, actual, want in zip(("outputs", "d_inputs", "d_coeffs"), found, wanted):
                    want = _chunk(want.detach(), -1, 2, chunks, rank)
                    actual = actual.detach().cpu()
                    for test in (torch.isnan, torch.isposinf, torch.isneginf):
                        assert torch.equal(test(actual), test(want)), f"{name}: {test.__name__} differs from the loop"
                    finite = torch.isfinite(want)
                    assert torch.allclose(actual[finite], want[finite], rtol=1e-4, atol=1e-4), name
            yield f"{regime} of the middle chunk's product reverse={reverse}", case


FAMILIES = {"matches": _family_matches, "errors": _family_errors, "transforms": _family_transforms,
            "nonfinite": _family_nonfinite}


def _rank_main(rank, world, device, seed, directory):
    """One rank: joins the group and runs every family's cases, writing its failures to a file."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # outputs the kernels leave unwritten are NaN
    torch.set_num_threads(1)  # tiny tensors: a pool of threads per rank would only oversubscribe the cores
    # Compiled graphs of this run only: inductor's cache keys do not cover a custom op's fake kernel.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(directory, "inductor"))
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    backend = "nccl" if device == "cuda" and torch.cuda.device_count() >= world else "gloo"
    # A generous timeout: on a loaded 2-core machine one rank's torch.compile can keep the others waiting
    # in a collective for minutes; a rank that timed out would leave the group and its peers' collectives
    # would then fail in gloo's threads, which aborts the process.
    dist.init_process_group(backend, init_method=f"file://{directory}/rendezvous", rank=rank, world_size=world,
                            timeout=timedelta(minutes=10))
    failures = {family: [] for family in FAMILIES}
    try:
        for family, cases in FAMILIES.items():
            for name, case in cases(device, rank, world, seed):
                try:
                    case()
                except Exception as error:  # every failure is reported, with the case that made it
                    failures[family].append(f"rank {rank}, {name}:\n{traceback.format_exc()}")
                    # The ranks are out of step (gloo reports its timeouts and closed pairs as RuntimeError):
                    # nothing after this is valid.
                    if isinstance(error, dist.DistError) or "gloo" in str(error):
                        return
    finally:
        Path(directory, f"rank{rank}.json").write_text(json.dumps(failures))
        dist.destroy_process_group()


def _world_params():
    for world in WORLD_SIZES:
        yield pytest.param(("cpu", world), id=f"cpu-{world}ranks")
        yield pytest.param(("cuda", world), id=f"cuda-{world}ranks", marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS),
                               reason="needs a CUDA GPU and linrec's CUDA kernels")])


@pytest.fixture(scope="module", params=list(_world_params()))
def failures(request, tmp_path_factory):
    """Every rank's failures, by family, from one run of all the cases across a process group."""
    device, world = request.param
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    directory = tmp_path_factory.mktemp(f"{device}{world}")
    mp.spawn(_rank_main, args=(world, device, seed, str(directory)), nprocs=world, join=True)
    merged = {family: [] for family in FAMILIES}
    for rank in range(world):
        for family, found in json.loads(Path(directory, f"rank{rank}.json").read_text()).items():
            merged[family] += found
    return merged


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sequence_parallel(failures, family):
    found = failures[family]
    assert not found, f"{len(found)} failing case(s) of {family}; the first:\n" + "\n".join(found[:3])


def test_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        linrec.distributed.linrec(torch.randn(4), torch.rand(4))


def test_every_case_is_counted():
    """The families cover what they claim (a family that yields no case cannot fail)."""
    for world in WORLD_SIZES:
        cases = list(_matching_cases(world))
        assert len(cases) == len(CHUNKS[world]) * (len(DTYPES) * 2 * 2 * 8 + 8 + 16) + 16
        assert any(0 in chunks for chunks, *_ in cases) and any(1 in chunks for chunks, *_ in cases)
