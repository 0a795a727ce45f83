"""Throughput of linrec next to torch.add on the same shape and dtype, forward and backward.

    python -m linrec bench [--device cpu|cuda] [--dtypes float32,bfloat16] [--out bench-results]
                           [--tables time-last,layouts,derivatives,selective-scan]
    python -m linrec bench --suite guard [--quick] [--out FILE.csv] [--compare BASELINE.csv ...]

The second form runs the benchmark guard (guard.py): a fixed grid over every kernel family and path,
compared with baselines to flag regressions; its --help lists its options. What follows describes the
first form's tables.

Prints GB/s of every implementation and its ratio to torch.add measured in the same process (on a GPU
with triton installed, the Triton kernels as "triton" beside the compiled ones as "linrec"), and
writes a CSV (and a PNG when matplotlib is installed). Bytes counted are the fewest each call must
move: forward reads inputs and coeffs and writes outputs (3 tensors); backward reads d_outputs,
coeffs and outputs and writes d_inputs and d_coeffs (5 tensors). torch.add moves 3 tensors; its
GB/s is the ceiling the ratio is taken against. A second table calls the public API with autograd, as
models do, on the layouts they use (time in the middle dim, packed sequences with cu_seqlens, broadcast
coefficients, complex): the forward on leaves that require grad (it records the graph) and the
backward alone (torch.autograd.grad of one recorded forward), with the same byte counts, against
torch.add of two inputs-sized tensors; the peak memory one forward and backward allocate beyond the
operands, in inputs-sized tensors (CUDA only); and for packed sequences the time of the same call
without cu_seqlens over the packed call's ("vs unpacked"). A third times the derivative paths of
the public API: forward and backward, forward-mode AD (torch.func.jvp) and a gradient penalty (double
backward), each in units of one torch.add on the same operands ("adds": the time of the whole step
over add's). A fourth times linrec.selective_scan (Mamba's S6) on a Mamba-like shape, forward and
forward+backward, against the same equations on torch's associative_scan and on a Python loop over
time (skipped past a length of 512), with the peak memory of forward+backward (CUDA only).
"""

from __future__ import annotations

import argparse
import csv
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import torch

from .._core.autograd import COMPILED, TRITON, Kernels
from .._core.library import HAS_CUDA_KERNELS
from .._core.triton import missing as triton_missing
from ..reference import REFERENCES
from ..scan import linrec
from ..ssm import selective_scan
from . import guard
from .guard import packed_offsets

#: (number of sequences, sequence length), time last. GPU shapes: 100 sequences per SM, and a few long ones.
#: CPU: one long row too, which the kernels split across threads.
CPU_SHAPES = [(256, 256), (64, 4096), (16, 65536), (65536, 16), (1, 1 << 24)]
# The references take O(L) Python steps (loop) or several full-size temporaries (hop, heinsen):
# run them only where they finish in reasonable time and memory.
MAX_REFERENCE_LENGTH = {"loop": 64, "hop": 1 << 16, "heinsen": 1 << 16}
MAX_REFERENCE_ELEMENTS = 1 << 24


def gpu_shapes(device: torch.device) -> list[tuple[int, int]]:
    sequences = 100 * torch.cuda.get_device_properties(device).multi_processor_count
    lengths = (256, 1024, 4096, 4095, 16384, 65536)  # 4095: rows not 16-byte aligned
    few_long = [(1, 1 << 24), (8, 1 << 21), (64, 1 << 18)]  # fewer sequences than SMs: split across blocks
    return [(sequences, length) for length in lengths] + [(1 << 20, 16), (1 << 18, 64)] + few_long


class LayoutCase(NamedTuple):
    """One row of the model-layout table."""

    name: str
    shape: tuple[int, ...]  # inputs
    dim: int  # time
    coeffs: tuple[int, ...] | None = None  # None: inputs' shape; () a 0-dim scalar
    sequences: int | None = None  # packed: this many sequences of random unequal lengths along dim (cu_seqlens)
    empty: bool = False  # packed: one of the sequences is empty
    initial: bool = False  # pass an initial state (requires grad too)
    dtype: torch.dtype | None = None  # run once in this dtype, whatever --dtypes says


def layout_cases(device: torch.device) -> list[LayoutCase]:
    """The model-layout table's cases: time in the middle dim, packed sequences, broadcast coefficients."""
    if device.type != "cuda":
        return [
            LayoutCase("btc", (4, 4096, 256), 1),
            LayoutCase("packed-16", (1, 4096, 256), 1, sequences=16),
            LayoutCase("coeffs-per-channel", (4, 4096, 256), 1, (256,)),
            LayoutCase("time-last", (256, 4096), -1),
            LayoutCase("complex", (4, 1024, 64), 1, dtype=torch.complex64),
        ]
    sequences = 100 * torch.cuda.get_device_properties(device).multi_processor_count
    btc = (16, 2048, 1024)  # (batch, time, channels)
    return [
        LayoutCase("btc", btc, 1),
        LayoutCase("btc-long", (4, 16384, 256), 1),
        LayoutCase("btc-large", (2, 65536, 1024), 1),  # 2^27 elements: the largest case
        LayoutCase("few-channels", (1, 1 << 20, 64), 1),
        *(LayoutCase(f"packed-{n}", (1, 65536, 1024), 1, sequences=n, empty=n == 4096) for n in (1, 16, 256, 4096)),
        LayoutCase("packed-last-64", (1, 1024, 65536), -1, sequences=64),
        LayoutCase("coeffs-per-channel", btc, 1, (1024,)),  # time-invariant filters
        LayoutCase("coeffs-shared", btc, 1, (16, 2048, 1)),  # one per (batch, time), shared by channels
        LayoutCase("coeffs-scalar", btc, 1, ()),
        LayoutCase("complex", (32, 1024, 256), 1, dtype=torch.complex64),
        LayoutCase("few-long", (1, 1 << 24), -1),  # fewer sequences than SMs
        LayoutCase("few-long", (64, 1 << 18), -1),
        LayoutCase("many-rows", (sequences, 4096), -1),
    ]


def measure_layouts(device: torch.device, dtypes: Iterable[torch.dtype], progress,
                    cases: list[LayoutCase] | None = None) -> list[dict]:
    """The public API with autograd on each layout: every real dtype of ``dtypes`` runs the cases without
    a dtype of their own (complex dtypes skip them), the others run once in theirs."""
    time_ms = timer(device)
    cases = layout_cases(device) if cases is None else cases
    real = [dtype for dtype in dtypes if dtype.is_floating_point]
    runs = [(dtype, case) for dtype in real for case in cases if case.dtype is None]
    runs += [(case.dtype, case) for case in cases if case.dtype is not None]
    backends = kernel_backends(device)
    rows = []
    for (dtype, case), impl in progress([(run, impl) for run in runs for impl in backends]):
        if impl == "triton" and dtype.is_complex:
            continue  # the Triton kernels take real dtypes
        rows.append(measure_layout(device, dtype, case, time_ms, impl, backends[impl]))
        gc.collect()  # the case's tensors and graphs are gone before the next one allocates its own
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure_layout(device: torch.device, dtype: torch.dtype, case: LayoutCase, time_ms, impl: str = "linrec",
                   backend: str = "auto") -> dict:
    """fwd: linrec.linrec on leaves that require grad (it records the graph), 3 tensors; bwd:
    torch.autograd.grad of one recorded forward, 5 tensors; both against torch.add of two inputs-sized
    tensors. peak: the memory one forward and backward allocate beyond the operands, in inputs-sized
    tensors (CUDA only). Packed cases also time the same call without cu_seqlens."""
    dim = case.dim % len(case.shape)
    inputs = torch.randn(case.shape, device=device, dtype=dtype).requires_grad_()
    coeffs = torch.rand(case.shape if case.coeffs is None else case.coeffs, device=device, dtype=dtype)
    if dtype.is_complex:
        coeffs *= 0.7  # |c| < 1, as for real coefficients in [0, 1)
    coeffs.requires_grad_()
    cu_seqlens = None if case.sequences is None else packed_offsets(case.shape[dim], case.sequences, case.empty).to(device)
    initial = None
    if case.initial:
        initial_shape = [size for axis, size in enumerate(case.shape) if axis != dim]
        if cu_seqlens is not None:
            initial_shape[0] = case.sequences
        initial = torch.randn(initial_shape, device=device, dtype=dtype).requires_grad_()
    leaves = (inputs, coeffs) if initial is None else (inputs, coeffs, initial)
    d_outputs = torch.randn_like(inputs)
    tensor_bytes = inputs.numel() * inputs.element_size()
    add_ms = time_ms(lambda: torch.add(inputs.detach(), d_outputs))

    def call(packed: bool = True) -> torch.Tensor:
        if packed or cu_seqlens is None:
            return linrec(inputs, coeffs, case.dim, initial=initial, cu_seqlens=cu_seqlens, backend=backend)
        # one sequence: the batch's initial state
        return linrec(inputs, coeffs, case.dim, initial=None if initial is None else initial[:1], backend=backend)

    def forward_backward_ms(packed: bool = True) -> tuple[float, float]:
        forward_ms = time_ms(lambda: call(packed))
        outputs = call(packed)
        backward_ms = time_ms(lambda: torch.autograd.grad(outputs, leaves, d_outputs, retain_graph=True))
        return forward_ms, backward_ms

    fwd_ms, bwd_ms = forward_backward_ms()
    vs_unpacked_fwd = vs_unpacked_bwd = None
    if cu_seqlens is not None:
        unpacked_fwd_ms, unpacked_bwd_ms = forward_backward_ms(packed=False)
        vs_unpacked_fwd, vs_unpacked_bwd = unpacked_fwd_ms / fwd_ms, unpacked_bwd_ms / bwd_ms
    peak = None  # CPU allocations cannot be measured reliably
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        gradients = list(torch.autograd.grad(call(), leaves, d_outputs))  # held until the peak is read
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / tensor_bytes
        gradients.clear()
    tensor_gb = tensor_bytes / 1e9
    add_gbps = 3 * tensor_gb / (add_ms / 1e3)
    fwd_gbps, bwd_gbps = 3 * tensor_gb / (fwd_ms / 1e3), 5 * tensor_gb / (bwd_ms / 1e3)
    return dict(device=device.type, dtype=str(dtype).removeprefix("torch."), impl=impl, case=case.name,
                shape=_shape_text(case.shape),
                dim=case.dim, coeffs=_shape_text(case.shape if case.coeffs is None else case.coeffs),
                sequences=case.sequences, initial=case.initial, add_ms=add_ms, fwd_ms=fwd_ms, fwd_gbps=fwd_gbps,
                fwd_ratio=fwd_gbps / add_gbps, bwd_ms=bwd_ms, bwd_gbps=bwd_gbps, bwd_ratio=bwd_gbps / add_gbps, peak=peak,
                vs_unpacked_fwd=vs_unpacked_fwd, vs_unpacked_bwd=vs_unpacked_bwd)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def derivative_cases(device: torch.device) -> list[tuple[tuple[int, ...], int]]:
    """(inputs shape, time dim) of the derivative-paths table: (batch, time, channels) and time last."""
    if device.type != "cuda":
        return [((4, 1024, 64), 1), ((256, 1024), -1)]
    return [((8, 4096, 1024), 1), ((1024, 4096), -1)]


def measure_derivatives(device: torch.device, dtypes: Iterable[torch.dtype], progress) -> list[dict]:
    time_ms = timer(device)
    rows = []
    for dtype, (shape, dim) in progress([(d, case) for d in dtypes for case in derivative_cases(device)]):
        inputs = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        coeffs = torch.rand(shape, device=device, dtype=dtype).requires_grad_()
        d_outputs, t_inputs, t_coeffs = (torch.randn_like(inputs) for _ in range(3))
        add_ms = time_ms(lambda: torch.add(inputs.detach(), coeffs.detach()))

        def forward_backward():
            torch.autograd.grad(linrec(inputs, coeffs, dim), (inputs, coeffs), d_outputs)

        def forward_mode():
            torch.func.jvp(lambda x, c: linrec(x, c, dim), (inputs.detach(), coeffs.detach()), (t_inputs, t_coeffs))

        def gradient_penalty():
            gradients = torch.autograd.grad(linrec(inputs, coeffs, dim), (inputs, coeffs), d_outputs, create_graph=True)
            torch.autograd.grad(sum((g * g).sum() for g in gradients), (inputs, coeffs))

        for path, fn in (("fwd+bwd", forward_backward), ("jvp", forward_mode), ("penalty", gradient_penalty)):
            ms = time_ms(fn)
            rows.append(dict(device=device.type, dtype=str(dtype).removeprefix("torch."), shape="x".join(map(str, shape)),
                             dim=dim, path=path, ms=ms, adds=ms / add_ms))
    return rows


class SelectiveScanCase(NamedTuple):
    """One shape of the selective-scan table: u, delta and z are (batch, d, length), A is (d, n), B and C
    are shared by the channels, (batch, n, length), as in Mamba."""

    batch: int
    d: int
    n: int
    length: int


#: The loop reference takes one Python step per time index forward and several backward: it runs only
#: up to this length (beyond, its row says skipped).
MAX_SELECTIVE_LOOP_LENGTH = 512
#: hop keeps its O(log length) levels of full-size (batch, d, n, length) temporaries for the backward.
MAX_SELECTIVE_HOP_ELEMENTS = 1 << 28
SELECTIVE_SCAN_BACKENDS = ("auto", "composed", "hop", "loop")


def selective_scan_cases(device: torch.device) -> list[SelectiveScanCase]:
    """Mamba-like shapes: on the GPU a layer of Mamba-130M's width at length 2048, and a short one on
    which the loop reference runs too; on the CPU one of a few seconds."""
    if device.type == "cuda":
        return [SelectiveScanCase(8, 1024, 16, 2048), SelectiveScanCase(8, 1024, 16, 256)]
    return [SelectiveScanCase(2, 64, 16, 512)]


def measure_selective_scan(device: torch.device, dtypes: Iterable[torch.dtype], progress,
                           cases: list[SelectiveScanCase] | None = None) -> list[dict]:
    """linrec.selective_scan with every optional term (D, z, delta_bias, softplus) and B, C shared by the
    channels, forward and forward+backward (the gradients of all eight tensor arguments), on the compiled
    kernels and on the pure-PyTorch references (the same equations, the recurrence run by torch's
    associative_scan or by a Python loop over time). Real dtypes of ``dtypes`` only: u, delta, z, B and C
    in the dtype, A, D and delta_bias in float32 (Mamba's parameters); the state is float32 either way."""
    time_ms = timer(device)
    cases = selective_scan_cases(device) if cases is None else cases
    runs = [(dtype, case) for dtype in dtypes if dtype.is_floating_point for case in cases]
    rows = []
    for dtype, case in progress(runs):
        rows += measure_selective_scan_case(device, dtype, case, time_ms)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure_selective_scan_case(device: torch.device, dtype: torch.dtype, case: SelectiveScanCase, time_ms) -> list[dict]:
    """One row per backend: ms of the forward and of forward+backward, the latter over the compiled
    kernels' ("x linrec"), and the peak memory of a forward+backward beyond the arguments (CUDA only)."""
    batch, d, n, length = case
    activations = (batch, d, length)
    arguments = dict(
        u=torch.randn(activations, device=device, dtype=dtype),
        delta=torch.randn(activations, device=device, dtype=dtype) - 1,  # softplus: about 0.3
        A=-torch.rand(d, n, device=device) - 0.5,
        B=torch.randn(batch, n, length, device=device, dtype=dtype),
        C=torch.randn(batch, n, length, device=device, dtype=dtype),
        D=torch.randn(d, device=device),
        z=torch.randn(activations, device=device, dtype=dtype),
        delta_bias=0.1 * torch.randn(d, device=device),
    )
    leaves = [tensor.requires_grad_() for tensor in arguments.values()]
    d_out = torch.randn(activations, device=device, dtype=dtype)
    base = dict(device=device.type, dtype=str(dtype).removeprefix("torch."),
                shape=_shape_text(tuple(case)), elements=batch * d * n * length)
    rows = []
    peers = {"mamba_ssm": mamba_selective_scan()} if device.type == "cuda" else {}
    for backend in (*SELECTIVE_SCAN_BACKENDS, *peers):
        name = "linrec" if backend == "auto" else backend
        row = dict(base, impl=name, fwd_ms=None, ms=None, vs_linrec=None, peak_mib=None, note=None)
        rows.append(row)
        if backend == "loop" and length > MAX_SELECTIVE_LOOP_LENGTH:
            row["note"] = f"skipped: length > {MAX_SELECTIVE_LOOP_LENGTH}"
            continue
        if backend == "hop" and row["elements"] > MAX_SELECTIVE_HOP_ELEMENTS:
            row["note"] = "skipped: state > 2^28 elements"
            continue
        if backend in peers and peers[backend] is None:
            row["note"] = "not installed"
            continue

        def forward(backend=backend):
            if backend in peers:
                return peers[backend](*arguments.values(), True)
            return selective_scan(**arguments, delta_softplus=True, backend=backend)

        def forward_backward(backend=backend):
            torch.autograd.grad(forward(backend), leaves, d_out)

        try:
            with torch.no_grad():
                row["fwd_ms"] = time_ms(forward)
            row["ms"] = time_ms(forward_backward)
            if device.type == "cuda":
                gc.collect()
                torch.cuda.synchronize(device)
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                forward_backward()
                torch.cuda.synchronize(device)
                row["peak_mib"] = (torch.cuda.max_memory_allocated(device) - before) / 2**20
        except torch.OutOfMemoryError:
            row["fwd_ms"] = row["ms"] = row["peak_mib"] = None
            row["note"] = "out of memory"
            gc.collect()
            torch.cuda.empty_cache()
    linrec_ms = rows[0]["ms"]
    for row in rows:
        if row["ms"] is not None and linrec_ms is not None:
            row["vs_linrec"] = row["ms"] / linrec_ms
    return rows


def mamba_selective_scan() -> Callable | None:
    """mamba_ssm's selective_scan_fn (its CUDA kernels), when mamba_ssm is installed with them."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception:  # not installed, or installed without its CUDA extension or its dependencies
        return None
    # linrec's stand-in (linrec.integrations.install_namespaces) is no peer
    return None if getattr(sys.modules.get("mamba_ssm"), "__linrec_namespace__", False) else selective_scan_fn


class TimingSpread:
    """The spread of each measurement the timers make: on the CPU the interquartile range of its calls, on
    the GPU the range of its three measurements, over the median. A quiet machine keeps it at a few percent."""

    #: The median spread beyond which the run's ratios are reported as unreliable: a quiet 2-core CPU machine
    #: gave 12% (calls of tens of microseconds), one busy with a compile 67%.
    LIMIT = 0.25

    def __init__(self) -> None:
        self.spreads: list[float] = []

    def add(self, times: list[float]) -> float:
        """Records the spread of ``times`` (one measurement's); returns their median."""
        median = statistics.median(times)
        if len(times) >= 3 and median > 0:
            if len(times) >= 4:
                low, _, high = statistics.quantiles(times, n=4)
            else:
                low, high = min(times), max(times)
            self.spreads.append((high - low) / median)
        return median

    def median(self) -> float | None:
        return statistics.median(self.spreads) if self.spreads else None


#: The spread of every measurement since the last reset (main resets it).
timing_spread = TimingSpread()


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds per call, after warm-up. On the GPU, the median of three separate
    measurements: a single one of a kernel of a few microseconds was seen 25% off in either direction.
    Each measurement's spread goes to timing_spread."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench

            def measure_once(fn):
                return do_bench(fn, warmup=25, rep=100, return_mode="median")
        except ImportError:
            measure_once = _median_cuda_events
        # A process's first measurement was seen at half speed (0.45 instead of 0.98 of torch.add):
        # one throwaway measurement first.
        measure_once(lambda: torch.empty(1 << 20, device=device).fill_(1.0))
        return lambda fn: timing_spread.add([measure_once(fn) for _ in range(3)])
    return _median_wall_clock


def time_one_call(fn: Callable[[], object], device_type: str) -> float:
    """Milliseconds of one call: between CUDA events on the GPU, on the wall clock on the CPU."""
    if device_type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start_s = time.perf_counter()
    fn()
    return (time.perf_counter() - start_s) * 1e3


def _median_cuda_events(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    return statistics.median(time_one_call(fn, "cuda") for _ in range(repeats))


def _median_wall_clock(fn, budget_s: float = 0.3) -> float:
    fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 100):
        times.append(time_one_call(fn, "cpu"))
    return timing_spread.add(times)


def kernel_backends(device: torch.device) -> dict[str, str]:
    """Name in the tables -> linrec's backend argument: the compiled kernels, and the Triton kernels on a
    GPU where triton is installed (on the CPU they would run on Triton's interpreter, far from speed)."""
    if device.type == "cuda" and triton_missing() is None:
        return {"linrec": "auto", "triton": "triton"}
    return {"linrec": "auto"}


def implementations(device: torch.device) -> dict[str, Callable | Kernels]:
    """The kernel families, called through their registered ops, then the pure-PyTorch references."""
    families = {"linrec": COMPILED, "triton": TRITON}
    return {**{name: families[name] for name in kernel_backends(device)}, **REFERENCES}


def measure(device: torch.device, dtypes: Iterable[torch.dtype], shapes, progress) -> list[dict]:
    time_ms = timer(device)
    rows = []
    cases = [(dtype, shape) for dtype in dtypes for shape in shapes]
    for dtype, (sequences, length) in progress(cases):
        inputs = torch.randn(sequences, length, device=device, dtype=dtype)
        coeffs = torch.rand(sequences, length, device=device, dtype=dtype)
        d_outputs = torch.randn_like(inputs)
        tensor_gb = inputs.numel() * inputs.element_size() / 1e9
        add_ms = time_ms(lambda: torch.add(inputs, coeffs))
        add_gbps = 3 * tensor_gb / (add_ms / 1e3)
        base = dict(device=device.type, dtype=str(dtype).removeprefix("torch."), sequences=sequences, length=length)
        rows.append(dict(base, impl="torch.add", direction="fwd", ms=add_ms, gbps=add_gbps, ratio=1.0))
        for name, reference in implementations(device).items():
            if isinstance(reference, Kernels):
                kernels = reference
                outputs = kernels.forward(inputs, coeffs)
                forward = lambda: kernels.forward(inputs, coeffs)  # noqa: E731
                backward = lambda: kernels.backward(d_outputs, coeffs, outputs)  # noqa: E731
            elif length > MAX_REFERENCE_LENGTH[name] or inputs.numel() > MAX_REFERENCE_ELEMENTS:
                continue
            else:
                x, c = inputs.clone().requires_grad_(), coeffs.clone().requires_grad_()
                outputs = reference(x, c, False)
                forward = lambda: reference(inputs, coeffs, False)  # noqa: E731
                backward = lambda: torch.autograd.grad(outputs, (x, c), d_outputs, retain_graph=True)  # noqa: E731
            for direction, fn, tensors in (("fwd", forward, 3), ("bwd", backward, 5)):
                ms = time_ms(fn)
                gbps = tensors * tensor_gb / (ms / 1e3)
                rows.append(dict(base, impl=name, direction=direction, ms=ms, gbps=gbps, ratio=gbps / add_gbps))
    return rows


#: Printed columns: (CSV key, header, format spec).
TABLE_COLUMNS = [("dtype", "dtype", ">8"), ("sequences", "seqs", ">8"), ("length", "len", ">6"), ("impl", "impl", ">10")]
LAYOUT_COLUMNS = [("dtype", "dtype", ">9"), ("impl", "impl", ">6"), ("case", "case", ">18"), ("shape", "shape", ">14"), ("dim", "dim", ">3"),
                  ("coeffs", "coeffs", ">14"), ("fwd_ratio", "fwd x add", ">9.2f"), ("bwd_ratio", "bwd x add", ">9.2f"),
                  ("peak", "peak", ">5.1f"), ("vs_unpacked_fwd", "fwd vs unpacked", ">15.2f"),
                  ("vs_unpacked_bwd", "bwd vs unpacked", ">15.2f")]
LAYOUT_TITLE = ("model layouts through the public API with autograd "
                "(ratio to torch.add; peak memory of fwd+bwd in inputs-sized tensors)")
DERIVATIVE_COLUMNS = [("dtype", "dtype", ">8"), ("shape", "shape", ">14"), ("dim", "dim", ">3"), ("path", "path", ">8"),
                      ("ms", "ms", ">9.4f"), ("adds", "adds", ">6.1f")]
SELECTIVE_SCAN_COLUMNS = [("dtype", "dtype", ">8"), ("shape", "b x d x n x len", ">17"), ("impl", "impl", ">6"),
                          ("fwd_ms", "fwd ms", ">9.3f"), ("ms", "fwd+bwd ms", ">10.3f"), ("vs_linrec", "x linrec", ">8.1f"),
                          ("peak_mib", "peak MiB", ">8.0f"), ("note", "note", "<")]
SELECTIVE_SCAN_TITLE = ("selective scan (Mamba S6; D, z, delta_bias, softplus; B, C shared by the channels): ms of the\n"
                        "forward (no grad) and of forward+backward (all 8 gradients), the latter over linrec's; peak memory of\n"
                        "forward+backward beyond the arguments (CUDA only, blank on the CPU). linrec: the fused kernels;\n"
                        "composed: one linrec.linrec call over the expanded state; hop and loop: the composed scan on torch's\n"
                        f"associative_scan or a Python loop over time (loop skipped past {MAX_SELECTIVE_LOOP_LENGTH} steps);\n"
                        "mamba_ssm: its selective_scan_fn, where installed")
TIMING_COLUMNS = [("direction", "dir", ">3"), ("ms", "ms", ">9.4f"), ("gbps", "GB/s", ">8.1f"), ("ratio", "x add", ">6.2f")]


def print_table(rows: list[dict], columns=TABLE_COLUMNS, timing_columns=TIMING_COLUMNS) -> None:
    columns = columns + timing_columns
    header = " ".join(f"{title:{spec.split('.')[0]}}" for _, title, spec in columns)
    print(header)
    print("-" * len(header))
    for row in rows:
        # None: not measured or not applicable, left blank
        print(" ".join(f"{'':{spec.split('.')[0]}}" if row[key] is None else f"{row[key]:{spec}}" for key, _, spec in columns))


def write_outputs(rows: list[dict], out_dir: Path, device: torch.device) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"linrec-bench-{device.type}.csv"
    write_csv(rows, csv_path)
    print(f"wrote {csv_path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'linrec[bench]'): no plot")
        return
    dtypes = sorted({row["dtype"] for row in rows})
    figure, axes = plt.subplots(len(dtypes), 2, figsize=(11, 3.6 * len(dtypes)), squeeze=False)
    for row_axes, dtype in zip(axes, dtypes):
        for ax, direction in zip(row_axes, ("fwd", "bwd")):
            for impl in dict.fromkeys(row["impl"] for row in rows):
                points = [r for r in rows if r["dtype"] == dtype and r["impl"] == impl
                          and r["direction"] in (direction, "fwd" if impl == "torch.add" else direction)]
                if points:
                    labels = [f"{r['sequences']}x{r['length']}" for r in points]
                    ax.plot(labels, [r["gbps"] for r in points], marker="o", label=impl)
            ax.set_title(f"{device.type} {dtype} {direction}")
            ax.set_ylabel("GB/s")
            ax.tick_params(axis="x", rotation=45)
            ax.legend(fontsize=7)
    figure.tight_layout()
    png_path = out_dir / f"linrec-bench-{device.type}.png"
    figure.savefig(png_path, dpi=100)
    print(f"wrote {png_path}")


#: The tables main() can measure, in the order it prints them.
TABLES = ("time-last", "layouts", "derivatives", "selective-scan")


#: What main() runs: the tables below, or the benchmark guard (guard.py), which parses its own options.
SUITES = ("tables", "guard")


def main(argv: list[str] | None = None) -> None:
    suite_parser = argparse.ArgumentParser(add_help=False)
    suite_parser.add_argument("--suite", choices=SUITES, default="tables")
    suite, rest = suite_parser.parse_known_args(argv)
    if suite.suite == "guard":
        status = guard.main(rest)
        if status:
            raise SystemExit(status)
        return
    parser = argparse.ArgumentParser(prog="python -m linrec bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=SUITES, default="tables",
                        help="tables (default), or guard: the benchmark guard, whose options --suite guard --help lists")
    default_device = "cuda" if torch.cuda.is_available() and HAS_CUDA_KERNELS else "cpu"
    parser.add_argument("--device", default=default_device, help=f"cpu or cuda (default: {default_device})")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help=f"comma-separated, of {','.join(BENCH_DTYPES)} (default: float32,bfloat16)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for the CSV and PNG")
    parser.add_argument("--tables", default=",".join(TABLES),
                        help=f"comma-separated tables to measure, of {','.join(TABLES)} (default: all)")
    args = parser.parse_args(argv)
    tables = [name.strip() for name in args.tables.split(",")]
    unknown = [name for name in tables if name not in TABLES]
    if unknown:
        parser.error(f"--tables: expected names of {', '.join(TABLES)}, got {', '.join(map(repr, unknown))}")

    device = torch.device(guard.check_device(parser, args.device))
    dtypes = parse_dtypes(parser, args.dtypes)
    try:
        from tqdm import tqdm as progress
    except ImportError:
        progress = lambda cases: cases  # noqa: E731
    print("\n".join(guard.machine_info(device)))
    core_use = guard.CoreUse()
    if device.type == "cpu":
        time.sleep(BUSY_PROBE_S)  # what other processes do before the first measurement
        if (share := core_use.others()) is not None and share > guard.busy_limit():
            print(f"warning: other processes keep {share:.0%} of the cores busy: the CPU timings below will be unreliable")
    timing_spread.spreads.clear()
    args.out.mkdir(parents=True, exist_ok=True)
    if "time-last" in tables:
        shapes = gpu_shapes(device) if device.type == "cuda" else CPU_SHAPES
        rows = measure(device, dtypes, shapes, progress)
        print_table(rows)
        write_outputs(rows, args.out, device)
    if "layouts" in tables:
        layout_rows = measure_layouts(device, dtypes, progress)
        print()
        print(LAYOUT_TITLE)
        print_table(layout_rows, LAYOUT_COLUMNS, [])
        write_csv(layout_rows, args.out / f"linrec-bench-layouts-{device.type}.csv")
    if "derivatives" in tables:
        derivative_rows = measure_derivatives(device, dtypes, progress)
        print()
        print_table(derivative_rows, DERIVATIVE_COLUMNS, [])
        write_csv(derivative_rows, args.out / f"linrec-bench-derivatives-{device.type}.csv")
    selective_rows = measure_selective_scan(device, dtypes, progress) if "selective-scan" in tables else []
    if selective_rows:
        print()
        print(SELECTIVE_SCAN_TITLE)
        print_table(selective_rows, SELECTIVE_SCAN_COLUMNS, [])
        write_csv(selective_rows, args.out / f"linrec-bench-selective-scan-{device.type}.csv")
    print()
    print(noise_report(device, core_use))


#: Seconds of other processes' CPU use sampled before a CPU run starts.
BUSY_PROBE_S = 0.5


def noise_report(device: torch.device, core_use: guard.CoreUse) -> str:
    """The run's noise in words: the median spread of its measurements and, on the CPU, the cores other
    processes kept busy; a warning when either is beyond what a quiet machine shows."""
    spread = timing_spread.median()
    parts = [f"the median measurement's spread was {spread:.0%}" if spread is not None else "no measurement"]
    busy = False
    if device.type == "cpu" and (share := core_use.others()) is not None:
        parts.append(f"other processes kept {share:.0%} of the cores busy")
        busy = share > guard.busy_limit()
    noisy = spread is not None and spread > TimingSpread.LIMIT
    if busy or noisy:
        return f"warning: the machine was busy or noisy ({'; '.join(parts)}): the ratios above are unreliable"
    return f"noise: {'; '.join(parts)}"


#: The dtypes the benchmarks take.
BENCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")


def parse_dtypes(parser: argparse.ArgumentParser, text: str) -> list[torch.dtype]:
    """--dtypes' comma-separated names as torch dtypes; one line of error (parser.error) for any other name."""
    names = [name.strip().removeprefix("torch.") for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BENCH_DTYPES]
    if unknown or not names:
        parser.error(f"--dtypes: expected comma-separated names of {', '.join(BENCH_DTYPES)}, got {text!r}")
    return [getattr(torch, name) for name in names]


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
