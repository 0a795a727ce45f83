"""The Triton backend through the public API, for A/B runs of two checkouts on one GPU machine: the ratio to
torch.add of the forward (without autograd) and of forward + backward through autograd (against 8/3 of an
add), and per call the host time, the kernels launched and the allocations made:

    PYTHONPATH=CHECKOUT/src python tools/triton_ab.py [--dtypes float32] [--coeff-range 0,1] [SHAPE:DIM ...]

SHAPE is 'x'-separated sizes, e.g. 13200x1024:-1 (time last). The default cases are the issue's rows:
13200 x 16384 and 13200 x 1024 (many rows, each scanned whole by one program) and 8 x 2^21 (few
long rows, split into segments). It imports nothing of linrec but ``linrec.linrec``, so that the same
script times any checkout; run it with each one's PYTHONPATH in turn on the same machine.

Host us is the median wall time of one call returning (the GPU left to catch up), kernels the kernels
the profiler saw per call, allocations the CUDA caching allocator's per call (``--names`` lists the
kernels, each with its launches per call and its mean GPU time). Ratios are medians of three
triton.testing.do_bench medians, as linrec's benchmarks take them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from triton.testing import do_bench

import linrec

CASES = ["13200x16384:-1", "13200x1024:-1", "8x2097152:-1"]
#: Calls per count: the profiler's and the allocator's totals are divided by it.
COUNTED_CALLS = 5


def parse(case: str) -> tuple[tuple[int, ...], int]:
    shape, _, dim = case.partition(":")
    return tuple(int(n) for n in shape.split("x")), int(dim or -1)


def ms(fn) -> float:
    return statistics.median(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))


def host_us(fn, calls: int = 20) -> float:
    """Median wall time of a call's return, each call started on an idle GPU (so the queue never fills)."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def counts(fn) -> tuple[float, float, Counter, Counter]:
    """Kernels launched and allocations made per call, and the kernels' launches and GPU microseconds by name."""
    fn()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(COUNTED_CALLS):
        fn()
    torch.cuda.synchronize()
    allocations = (torch.cuda.memory_stats()["allocation.all.allocated"] - allocated) / COUNTED_CALLS
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(COUNTED_CALLS):
            fn()
        torch.cuda.synchronize()
    kernels, kernel_us = Counter(), Counter()
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in event.name:
            kernels[event.name] += 1
            kernel_us[event.name] += event.time_range.elapsed_us()
    return kernels.total() / COUNTED_CALLS, allocations, kernels, kernel_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--coeff-range", default="0,1", help="LOW,HIGH: coefficients uniform in [LOW, HIGH)")
    parser.add_argument("--names", action="store_true", help="list the kernels each call launches")
    parser.add_argument("cases", nargs="*", default=CASES)
    args = parser.parse_args()
    low, high = (float(n) for n in args.coeff_range.split(","))
    print(f"linrec from {linrec.__file__}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'dtype':>8} {'case':>16} {'add us':>7} {'fwd x add':>9} {'step x add':>10} {'fwd host us':>11} "
          f"{'step host us':>12} {'fwd kernels':>11} {'step kernels':>12} {'fwd allocs':>10} {'step allocs':>11}")
    for dtype in [getattr(torch, name) for name in args.dtypes.split(",")]:
        for case in args.cases:
            shape, dim = parse(case)
            inputs = torch.randn(shape, device="cuda", dtype=dtype)
            coeffs = torch.empty(shape, device="cuda", dtype=dtype).uniform_(low, high)
            d_outputs = torch.randn_like(inputs)
            leaves = (inputs.clone().requires_grad_(), coeffs.clone().requires_grad_())

            def forward():
                return linrec.linrec(inputs, coeffs, dim, backend="triton")

            def step():
                return torch.autograd.grad(linrec.linrec(*leaves, dim, backend="triton"), leaves, d_outputs)

            add_ms = ms(lambda: torch.add(inputs, coeffs))
            forward_ratio, step_ratio = add_ms / ms(forward), 8 / 3 * add_ms / ms(step)
            forward_kernels, forward_allocations, *forward_names = counts(forward)
            step_kernels, step_allocations, *step_names = counts(step)
            print(f"{str(dtype).removeprefix('torch.'):>8} {case:>16} {add_ms * 1e3:>7.1f} {forward_ratio:>9.2f} "
                  f"{step_ratio:>10.2f} {host_us(forward):>11.1f} {host_us(step):>12.1f} {forward_kernels:>11.1f} "
                  f"{step_kernels:>12.1f} {forward_allocations:>10.1f} {step_allocations:>11.1f}", flush=True)
            if args.names:
                for what, (names, kernel_us) in (("forward", forward_names), ("step", step_names)):
                    for name, count in names.most_common():
                        print(f"{'':>26} {what:>7} {count / COUNTED_CALLS:4.1f} x {kernel_us[name] / count:8.1f} us "
                              f"{name[:90]}")
            del inputs, coeffs, d_outputs, leaves


if __name__ == "__main__":
    main()
