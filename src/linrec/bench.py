"""Throughput of linrec next to torch.add on the same shape and dtype, forward and backward.

    python -m linrec.bench [--device cpu|cuda] [--dtypes float32,bfloat16] [--out bench-results]

Prints GB/s of every implementation and its ratio to torch.add measured in the same process, and
writes a CSV (and a PNG when matplotlib is installed). Bytes counted are the fewest each call must
move: forward reads inputs and coeffs and writes outputs (3 tensors); backward reads d_outputs,
coeffs and outputs and writes d_inputs and d_coeffs (5 tensors). torch.add moves 3 tensors; its
GB/s is the ceiling the ratio is taken against. A second table times the compiled kernels on the
layouts models use (time in the middle dim, broadcast coefficients), with the same byte counts. A third
times the public API as training code calls it, with autograd: forward and backward, forward-mode AD
(torch.func.jvp) and a gradient penalty (double backward), each in units of one torch.add on the same
operands ("adds": the time of the whole step over add's).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

import linrec

#: (number of sequences, sequence length), time last. GPU shapes: 100 sequences per SM, and a few long ones.
CPU_SHAPES = [(256, 256), (64, 4096), (16, 65536), (65536, 16)]
# The references take O(L) Python steps (loop) or several full-size temporaries (hop, heinsen):
# run them only where they finish in reasonable time and memory.
MAX_REFERENCE_LENGTH = {"loop": 64, "hop": 1 << 16, "heinsen": 1 << 16}
MAX_REFERENCE_ELEMENTS = 1 << 24


def gpu_shapes(device: torch.device) -> list[tuple[int, int]]:
    sequences = 100 * torch.cuda.get_device_properties(device).multi_processor_count
    lengths = (256, 1024, 4096, 4095, 16384, 65536)  # 4095: rows not 16-byte aligned
    few_long = [(1, 1 << 24), (8, 1 << 21), (64, 1 << 18)]  # fewer sequences than SMs: split across blocks
    return [(sequences, length) for length in lengths] + [(1 << 20, 16), (1 << 18, 64)] + few_long


def layout_cases(device: torch.device) -> list[tuple[tuple[int, ...], int, tuple[int, ...] | None]]:
    """(inputs shape, time dim, coeffs shape or None for inputs' shape) of the model-layout table."""
    if device.type != "cuda":
        return [((4, 4096, 256), 1, None), ((256, 4096), -1, (256, 1))]
    sequences = 100 * torch.cuda.get_device_properties(device).multi_processor_count
    return [
        ((8, 4096, 4096), 1, None),  # (batch, time, channels)
        ((1, 1 << 20, 64), 1, None),  # few channels, long time
        ((8, 4096, 4096), 1, (8, 4096, 1)),  # one coefficient per (batch, time), shared by channels
        ((sequences, 4096), -1, (sequences, 1)),  # one time-invariant coefficient per row
    ]


def measure_layouts(device: torch.device, dtypes: Iterable[torch.dtype], progress) -> list[dict]:
    time_ms = timer(device)
    rows = []
    for dtype, (shape, dim, coeffs_shape) in progress([(d, case) for d in dtypes for case in layout_cases(device)]):
        inputs = torch.randn(shape, device=device, dtype=dtype)
        coeffs = torch.rand(coeffs_shape or shape, device=device, dtype=dtype)
        d_outputs = torch.randn_like(inputs)
        tensor_gb = inputs.numel() * inputs.element_size() / 1e9
        full_coeffs = torch.rand_like(inputs)
        add_gbps = 3 * tensor_gb / (time_ms(lambda: torch.add(inputs, full_coeffs)) / 1e3)
        outputs = torch.ops.linrec.forward(inputs, coeffs, dim)
        calls = {
            "fwd": (3, lambda: torch.ops.linrec.forward(inputs, coeffs, dim)),
            "bwd": (5, lambda: torch.ops.linrec.backward(d_outputs, coeffs, outputs, dim)),
        }
        for direction, (tensors, fn) in calls.items():
            ms = time_ms(fn)
            gbps = tensors * tensor_gb / (ms / 1e3)
            rows.append(dict(device=device.type, dtype=str(dtype).removeprefix("torch."), shape="x".join(map(str, shape)),
                             dim=dim, coeffs="x".join(map(str, coeffs_shape or shape)), direction=direction, ms=ms,
                             gbps=gbps, ratio=gbps / add_gbps))
    return rows


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
            torch.autograd.grad(linrec.linrec(inputs, coeffs, dim), (inputs, coeffs), d_outputs)

        def forward_mode():
            torch.func.jvp(lambda x, c: linrec.linrec(x, c, dim), (inputs.detach(), coeffs.detach()), (t_inputs, t_coeffs))

        def gradient_penalty():
            gradients = torch.autograd.grad(linrec.linrec(inputs, coeffs, dim), (inputs, coeffs), d_outputs, create_graph=True)
            torch.autograd.grad(sum((g * g).sum() for g in gradients), (inputs, coeffs))

        for path, fn in (("fwd+bwd", forward_backward), ("jvp", forward_mode), ("penalty", gradient_penalty)):
            ms = time_ms(fn)
            rows.append(dict(device=device.type, dtype=str(dtype).removeprefix("torch."), shape="x".join(map(str, shape)),
                             dim=dim, path=path, ms=ms, adds=ms / add_ms))
    return rows


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds per call, after warm-up. On the GPU, the median of three separate
    measurements: a single one of a kernel of a few microseconds was seen 25% off in either direction."""
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
        return lambda fn: statistics.median(measure_once(fn) for _ in range(3))
    return _median_wall_clock


def _median_cuda_events(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _median_wall_clock(fn, budget_s: float = 0.3) -> float:
    fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 100):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def implementations() -> dict[str, Callable | None]:
    """None stands for the compiled kernels, called through the registered ops."""
    return {"linrec": None, **linrec.REFERENCES}


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
        for name, reference in implementations().items():
            if reference is not None and (length > MAX_REFERENCE_LENGTH[name] or inputs.numel() > MAX_REFERENCE_ELEMENTS):
                continue
            if reference is None:
                outputs = torch.ops.linrec.forward(inputs, coeffs)
                forward = lambda: torch.ops.linrec.forward(inputs, coeffs)  # noqa: E731
                backward = lambda: torch.ops.linrec.backward(d_outputs, coeffs, outputs)  # noqa: E731
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
LAYOUT_COLUMNS = [("dtype", "dtype", ">8"), ("shape", "shape", ">14"), ("dim", "dim", ">3"), ("coeffs", "coeffs", ">14")]
DERIVATIVE_COLUMNS = [("dtype", "dtype", ">8"), ("shape", "shape", ">14"), ("dim", "dim", ">3"), ("path", "path", ">8"),
                      ("ms", "ms", ">9.4f"), ("adds", "adds", ">6.1f")]
TIMING_COLUMNS = [("direction", "dir", ">3"), ("ms", "ms", ">9.4f"), ("gbps", "GB/s", ">8.1f"), ("ratio", "x add", ">6.2f")]


def print_table(rows: list[dict], columns=TABLE_COLUMNS, timing_columns=TIMING_COLUMNS) -> None:
    columns = columns + timing_columns
    header = " ".join(f"{title:{spec.split('.')[0]}}" for _, title, spec in columns)
    print(header)
    print("-" * len(header))
    for row in rows:
        print(" ".join(f"{row[key]:{spec}}" for key, _, spec in columns))


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS else "cpu"
    parser.add_argument("--device", default=default_device, help=f"cpu or cuda (default: {default_device})")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for the CSV and PNG")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    dtypes = [getattr(torch, name.strip()) for name in args.dtypes.split(",")]
    shapes = gpu_shapes(device) if device.type == "cuda" else CPU_SHAPES
    try:
        from tqdm import tqdm as progress
    except ImportError:
        progress = lambda cases: cases  # noqa: E731
    print(f"linrec {linrec.__version__}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else f" ({torch.get_num_threads()} threads)"))
    rows = measure(device, dtypes, shapes, progress)
    print_table(rows)
    write_outputs(rows, args.out, device)
    layout_rows = measure_layouts(device, dtypes, progress)
    print()
    print_table(layout_rows, LAYOUT_COLUMNS)
    write_csv(layout_rows, args.out / f"linrec-bench-layouts-{device.type}.csv")
    derivative_rows = measure_derivatives(device, dtypes, progress)
    print()
    print_table(derivative_rows, DERIVATIVE_COLUMNS, [])
    write_csv(derivative_rows, args.out / f"linrec-bench-derivatives-{device.type}.csv")


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
