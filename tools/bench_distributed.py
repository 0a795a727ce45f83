"""Sequence-parallel linrec.distributed.linrec: the time of one sequence split across W ranks, the part of it
the exchange between the ranks takes, and the longest sequence W GPUs hold.

    python tools/bench_distributed.py [--device cuda|cpu] [--ranks 1,2] [--cases row,btc]
        [--row-elements 268435456] [--btc-steps 4194304] [--scale 1] [--rep-ms 100]
        [--capacity | --no-capacity] [--threads N] [--csv PATH]
    python tools/bench_distributed.py                                            # GPUs: W = 1, 2, full size
    python tools/bench_distributed.py --ranks 1,2,4,8 --csv bench-results/linrec-bench-distributed.csv
    python tools/bench_distributed.py --device cpu --ranks 1,2,3 --scale 4096    # smoke test on the CPU

For each W of --ranks the script spawns W processes (NCCL with rank r on cuda:r, at most one rank per GPU;
gloo on the CPU, with --threads torch threads per rank, by default the cores shared out between the ranks)
and runs every case of --cases on them:

- row: one sequence of --row-elements float32 elements, shape (N,), time dim 0;
- btc: one (1, T, 1024) bfloat16 sequence along dim 1, T = --btc-steps;

both sizes divided by --scale. Rank r allocates its own chunk only: the r-th of W near-equal chunks along
time. Every rank measures the median time of one call of:

- fwd: linrec.distributed.linrec without grad;
- f+b: the same on inputs and coeffs that require grad, and torch.autograd.grad with fixed random d_outputs;
- exchange: what the call communicates, alone. Forward: the check that the ranks' chunks line up
  (linrec.distributed._agree of the call's _local_record, read back on the host) and the all_gather of the
  (2, *state) maps in the carry dtype (_gather); backward: the all_gather of the state. "share": the
  forward's exchange over fwd, the forward's and backward's together over f+b;
- fwd x add: torch.add of the same local operands over fwd, the project's ratio to torch.add (1.0: the
  forward takes one add's time; the ranks but the first and the last scan their chunk twice);
- for W = 1, plain linrec.linrec on the same operands: "plain ms" (fwd/f+b) and "x plain", the distributed
  call's time over it (fwd/f+b): the sequence-parallel overhead on one device.

Times show rank 0's and the maximum over the ranks ("r0/max"); shares and ratios use the maximums. Every
rank makes the same calls, each alone after a dist.barrier() (CUDA events on the GPU, the wall clock on the
CPU), as many as the slowest rank's estimate fits in --rep-ms (5 to 100): triton.testing.do_bench and
linrec.tools.bench.timer, which the other benchmarks use, take their number of calls from each process's own
estimate, which would leave the ranks' collectives unmatched.

capacity (CUDA only, on by default there): the peak torch.cuda.max_memory_allocated of one f+b at the
benchmark size, per step of the sequence ("B/step", the largest over the ranks; a step: one element of row,
one 1024-channel slice of btc); each rank's free memory (torch.cuda.mem_get_info) over its own peak per step,
the smallest times W ("est", total steps); then f+b at 95% of the estimate, halved until it runs on every
rank ("ran", total steps). Each try first allocates the operands and the rest of the peak as one block, the
ranks agreeing (an all_reduce of a success flag) before the call's collectives start: a rank that runs out
of memory inside the call afterwards would leave the others waiting in them, so that stops the run for W.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import linrec
from linrec.tools.bench import time_one_call
from linrec._core.checks import initial_shape
from linrec.distributed import _agree, _gather, _local_record
from linrec.reference import compute_dtype


class Case(NamedTuple):
    """One sequence of shape (*before, steps, *after), time the dim between."""

    name: str
    dtype: torch.dtype
    before: tuple[int, ...]
    after: tuple[int, ...]

    @property
    def dim(self) -> int:
        return len(self.before)

    def shape(self, steps: int) -> tuple[int, ...]:
        return (*self.before, steps, *self.after)


CASES = {
    "row": Case("row", torch.float32, (), ()),
    "btc": Case("btc", torch.bfloat16, (1,), (1024,)),
}
MIN_CALLS, MAX_CALLS, WARMUP_CALLS, ESTIMATE_CALLS = 5, 100, 2, 3
FIT_FRACTION = 0.95  # of the estimated capacity, where its verification starts


class Timer:
    """Median milliseconds of one call on this rank; every rank makes the same number of calls."""

    def __init__(self, device: torch.device, rep_ms: float) -> None:
        self.device, self.rep_ms = device, rep_ms

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], object]) -> float:
        dist.barrier()
        for _ in range(WARMUP_CALLS):
            fn()
        self.synchronize()
        start = time.perf_counter()
        for _ in range(ESTIMATE_CALLS):
            fn()
        self.synchronize()
        estimate_ms = group_reduce([(time.perf_counter() - start) * 1e3 / ESTIMATE_CALLS], dist.ReduceOp.MAX,
                                   self.device)[0]
        calls = int(min(MAX_CALLS, max(MIN_CALLS, self.rep_ms / max(estimate_ms, 1e-6))))
        times = []
        for _ in range(calls):
            dist.barrier()
            self.synchronize()
            times.append(time_one_call(fn, self.device.type))
        return statistics.median(times)


def group_reduce(values: list[float], op: dist.ReduceOp.RedOpType, device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def all_ranks(ok: bool, flag: torch.Tensor) -> bool:
    """Whether ``ok`` holds on every rank (``flag``: a preallocated one-element tensor on the device)."""
    flag.fill_(float(ok))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def chunk_steps(total: int, world: int, rank: int) -> int:
    """This rank's share of ``total`` steps: near-equal chunks, the first ranks one step longer."""
    base, extra = divmod(total, world)
    return base + (rank < extra)


def operands(case: Case, steps: int, device: torch.device, rank: int) -> tuple[torch.Tensor, ...]:
    """This rank's chunk: inputs and coeffs in [0, 1) that require grad, and d_outputs."""
    torch.manual_seed(rank)
    shape = case.shape(steps)
    inputs = torch.randn(shape, device=device, dtype=case.dtype).requires_grad_()
    coeffs = torch.rand(shape, device=device, dtype=case.dtype).requires_grad_()
    return inputs, coeffs, torch.randn(shape, device=device, dtype=case.dtype)


def measure_times(case: Case, steps: int, device: torch.device, rank: int, world: int,
                  args: argparse.Namespace) -> tuple[dict[str, float], float | None]:
    """This rank's median ms of each measurement, and for --capacity the peak bytes of one f+b per step."""
    baseline = torch.cuda.memory_allocated(device) if args.capacity else 0
    inputs, coeffs, d_outputs = operands(case, steps, device, rank)
    x, c, dim = inputs.detach(), coeffs.detach(), case.dim
    state = torch.zeros(initial_shape(x, dim, None), dtype=compute_dtype(case.dtype), device=device)
    maps = torch.zeros(2, *state.shape, dtype=state.dtype, device=device)
    group = dist.group.WORLD

    def forward_backward() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(linrec.distributed.linrec(inputs, coeffs, dim), (inputs, coeffs), d_outputs)

    def exchange_forward() -> torch.Tensor:
        _agree(None, _local_record((x, c, dim, False, None, False)), device, group)
        return _gather(maps, group)

    calls: dict[str, Callable[[], object]] = {
        "add": lambda: torch.add(x, c),
        "fwd": lambda: linrec.distributed.linrec(x, c, dim),
        "fb": forward_backward,
        "exchange_fwd": exchange_forward,
        "exchange_bwd": lambda: _gather(state, group),
    }
    if world == 1:
        calls["plain_fwd"] = lambda: linrec.linrec(x, c, dim)
        calls["plain_fb"] = lambda: torch.autograd.grad(linrec.linrec(inputs, coeffs, dim), (inputs, coeffs),
                                                        d_outputs)
    timer = Timer(device, args.rep_ms)
    times = {}
    for name, fn in calls.items():
        with torch.set_grad_enabled(name.endswith("fb")):
            times[name] = timer(fn)
    peak_per_step = None
    if args.capacity:
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        forward_backward()
        torch.cuda.synchronize(device)
        peak_per_step = (torch.cuda.max_memory_allocated(device) - baseline) / steps
    return times, peak_per_step


def fits(case: Case, steps: int, device: torch.device, rank: int, world: int, peak_per_step: float,
         flag: torch.Tensor) -> bool:
    """Whether f+b on chunks of ``steps`` runs on every rank: the operands and the rest of the measured peak
    (one block, freed at once: it stays in the allocator's cache for the call) must fit on every rank before
    the call starts."""
    try:
        inputs, coeffs, d_outputs = operands(case, steps, device, rank)
        operand_bytes = 3 * inputs.numel() * inputs.element_size()
        torch.empty(max(0, math.ceil(peak_per_step * steps) - operand_bytes), dtype=torch.uint8, device=device)
        allocated = True
    except torch.cuda.OutOfMemoryError:
        allocated = False
    if not all_ranks(allocated, flag):
        return False
    try:
        torch.autograd.grad(linrec.distributed.linrec(inputs, coeffs, case.dim), (inputs, coeffs), d_outputs)
        torch.cuda.synchronize(device)
        ran = True
    except torch.cuda.OutOfMemoryError as error:
        if world > 1:
            raise RuntimeError(f"rank {rank} ran out of memory inside the call on a chunk of {steps} steps after "
                               "the allocation check passed: the other ranks wait in its collectives") from error
        ran = False
    return all_ranks(ran, flag)


def capacity(case: Case, device: torch.device, rank: int, world: int, peak_per_step: float) -> tuple[int, int]:
    """(estimated, verified) largest total sequence length, in steps, on ``world`` ranks."""
    flag = torch.ones(1, device=device)
    gc.collect()
    torch.cuda.empty_cache()
    free_bytes, _ = torch.cuda.mem_get_info(device)
    local = int(group_reduce([free_bytes // peak_per_step], dist.ReduceOp.MIN, device)[0])
    steps = int(FIT_FRACTION * local)
    while steps > 0:
        if fits(case, steps, device, rank, world, peak_per_step, flag):
            return world * local, world * steps
        gc.collect()
        torch.cuda.empty_cache()
        steps //= 2
    return world * local, 0


def total_steps(case: Case, args: argparse.Namespace) -> int:
    return (args.row_elements if case.name == "row" else args.btc_steps) // args.scale


def measure_case(case: Case, device: torch.device, rank: int, world: int, args: argparse.Namespace) -> dict:
    """One row of the case's table (complete on rank 0; every rank must call it)."""
    total = total_steps(case, args)
    steps = chunk_steps(total, world, rank)
    times, peak_per_step = measure_times(case, steps, device, rank, world, args)
    times["exchange_fb"] = times["exchange_fwd"] + times["exchange_bwd"]
    maxima = dict(zip(times, group_reduce(list(times.values()), dist.ReduceOp.MAX, device)))
    on_cpu = device.type == "cpu"
    row = dict(case=case.name, device="cpu" if on_cpu else torch.cuda.get_device_name(device),
               threads_per_rank=torch.get_num_threads() if on_cpu else None,
               dtype=str(case.dtype).removeprefix("torch."), total_steps=total, world=world,
               local_shape="x".join(map(str, case.shape(steps))), local_elements=math.prod(case.shape(steps)))
    for name in ("fwd", "fb", "exchange_fwd", "exchange_fb", "exchange_bwd", "add"):
        row[f"{name}_ms_rank0"], row[f"{name}_ms_max"] = times[name], maxima[name]
    row.update(exchange_fwd_share=maxima["exchange_fwd"] / maxima["fwd"],
               exchange_fb_share=maxima["exchange_fb"] / maxima["fb"], fwd_x_add=maxima["add"] / maxima["fwd"],
               plain_fwd_ms=times.get("plain_fwd"), plain_fb_ms=times.get("plain_fb"),
               peak_bytes_per_step=None, capacity_estimate=None, capacity_ran=None)
    if args.capacity:
        row["peak_bytes_per_step"] = group_reduce([peak_per_step], dist.ReduceOp.MAX, device)[0]
        row["capacity_estimate"], row["capacity_ran"] = capacity(case, device, rank, world, peak_per_step)
    return row


def worker(rank: int, world: int, args: argparse.Namespace, folder: str) -> None:
    """One rank: runs every case and, on rank 0, appends its rows to folder/rows.jsonl."""
    init = f"file://{folder}/store"
    if args.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for name in args.cases:
        row = measure_case(CASES[name], device, rank, world, args)
        if rank == 0:
            with open(Path(folder) / "rows.jsonl", "a") as handle:
                handle.write(json.dumps(row) + "\n")
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # Not on an error: the other ranks may wait in a collective, and spawn ends them once this rank exits.
    dist.destroy_process_group()


def ms_pair(row: dict, name: str) -> str:
    return f"{row[f'{name}_ms_rank0']:.3f}/{row[f'{name}_ms_max']:.3f}"


def steps_text(steps: int | None) -> str:
    return "" if steps is None else f"{steps / 1e6:.1f}M"


#: (header, cell of a row).
COLUMNS: list[tuple[str, Callable[[dict], str]]] = [
    ("W", lambda row: str(row["world"])),
    ("local elems", lambda row: str(row["local_elements"])),
    ("fwd ms r0/max", lambda row: ms_pair(row, "fwd")),
    ("f+b ms r0/max", lambda row: ms_pair(row, "fb")),
    ("xchg fwd ms", lambda row: ms_pair(row, "exchange_fwd")),
    ("share", lambda row: f"{row['exchange_fwd_share']:.1%}"),
    ("xchg f+b ms", lambda row: ms_pair(row, "exchange_fb")),
    ("share", lambda row: f"{row['exchange_fb_share']:.1%}"),
    ("fwd x add", lambda row: f"{row['fwd_x_add']:.2f}"),
    ("plain ms", lambda row: "" if row["plain_fwd_ms"] is None else
     f"{row['plain_fwd_ms']:.3f}/{row['plain_fb_ms']:.3f}"),
    ("x plain", lambda row: "" if row["plain_fwd_ms"] is None else
     f"{row['fwd_ms_max'] / row['plain_fwd_ms']:.2f}/{row['fb_ms_max'] / row['plain_fb_ms']:.2f}"),
    ("B/step", lambda row: "" if row["peak_bytes_per_step"] is None else f"{row['peak_bytes_per_step']:.1f}"),
    ("est", lambda row: steps_text(row["capacity_estimate"])),
    ("ran", lambda row: steps_text(row["capacity_ran"])),
]


def print_table(case: Case, rows: list[dict]) -> None:
    shape = "x".join(map(str, case.shape(rows[0]["total_steps"])))
    where = rows[0]["device"]
    if where == "cpu":
        threads = ", ".join(f"W={row['world']}: {row['threads_per_rank']}" for row in rows)
        where += f" (torch threads per rank: {threads})"
    print(f"\n{case.name}: one {shape} {rows[0]['dtype']} sequence along dim {case.dim}, on {where}")
    cells = [[cell(row) for _, cell in COLUMNS] for row in rows]
    widths = [max(len(header), *(len(line[i]) for line in cells)) for i, (header, _) in enumerate(COLUMNS)]
    header = " ".join(f"{title:>{width}}" for (title, _), width in zip(COLUMNS, widths))
    print(header)
    print("-" * len(header))
    for line in cells:
        print(" ".join(f"{cell:>{width}}" for cell, width in zip(line, widths)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, choices=["cpu", "cuda"],
                        help=f"default: {default_device}")
    parser.add_argument("--ranks", default="1,2", help="comma-separated numbers of ranks W")
    parser.add_argument("--cases", default="row,btc", help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--row-elements", type=int, default=2**28, help="row: the sequence's length")
    parser.add_argument("--btc-steps", type=int, default=2**22, help="btc: the sequence's length T")
    parser.add_argument("--scale", type=int, default=1, help="divides both lengths (small runs on the CPU)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="time each measurement aims at")
    parser.add_argument("--capacity", action=argparse.BooleanOptionalAction, default=None,
                        help="measure the longest sequence that fits (default: on with CUDA; CUDA only)")
    parser.add_argument("--threads", type=int, help="CPU: torch threads per rank (default: the cores over W)")
    parser.add_argument("--csv", type=Path, help="also write the rows there")
    args = parser.parse_args(argv)
    args.ranks = [int(n) for n in args.ranks.split(",")]
    args.cases = args.cases.split(",")
    if unknown := [name for name in args.cases if name not in CASES]:
        parser.error(f"unknown cases {unknown}: choose from {list(CASES)}")
    if min(args.ranks) < 1 or args.scale < 1 or (args.threads or 1) < 1:
        parser.error("--ranks, --scale and --threads must be positive")
    if short := [name for name in args.cases if total_steps(CASES[name], args) < max(args.ranks)]:
        parser.error(f"cases {short} have fewer steps than ranks after --scale {args.scale}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is available")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"linrec {linrec.__version__}, torch {torch.__version__}")  # no CUDA context here: the ranks hold the GPUs
    if args.capacity and args.device != "cuda":
        print("capacity: measured on CUDA only, skipped")
    args.capacity = args.device == "cuda" and args.capacity is not False
    rows: list[dict] = []
    failed = False
    for world in args.ranks:
        if args.device == "cuda" and world > torch.cuda.device_count():
            print(f"W={world} skipped: {torch.cuda.device_count()} GPU(s), one rank per GPU")
            continue
        print(f"W={world}: running", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            try:
                mp.spawn(worker, args=(world, args, folder), nprocs=world, join=True)
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:  # keeps the finished cases' rows
                failed = True
                print(f"W={world} failed:\n{error}", file=sys.stderr)
            results = Path(folder) / "rows.jsonl"
            if results.exists():
                rows += [json.loads(line) for line in results.read_text().splitlines()]
    for name in args.cases:
        case_rows = [row for row in rows if row["case"] == name]
        if case_rows:
            print_table(CASES[name], case_rows)
    if args.csv and rows:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
