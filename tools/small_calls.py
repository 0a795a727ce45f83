"""Small calls, where what a call costs beyond its elements shows: ``import linrec`` on top of ``import torch``;
``linrec.linrec`` on sequences of 0, 1 and 2 steps in four layouts (time last ``(C, L)``, time first ``(L, C)``
along dim 0, ``(1, L, C)`` along dim 1, and C sequences packed along ``(1, C * L)`` by cu_seqlens), forward
without autograd and forward and backward through autograd, beside ``torch.add`` of the same elements; and the
fused selective scan on the CPU (batch 1, d = 512, n = 16, D, z, delta_bias, softplus, B and C shared by the
channels) at lengths 1, 16 and 256. Host medians of 7 rounds (tools/per_call.py), each round about 0.1 s of
calls; import times the median of 5 fresh processes.

    python tools/small_calls.py [--sequences 8192,32768] [--threads 2]
"""

import argparse
import subprocess
import sys
import time

import torch
from per_call import median_us  # tools/ is on the path of a script run from it

import linrec

_IMPORT = "import time, torch; start = time.perf_counter(); import linrec; print(time.perf_counter() - start)"


def import_seconds(processes: int = 5) -> float:
    """Median seconds of ``import linrec`` after ``import torch``, each in a fresh process."""
    times = sorted(float(subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True,
                                        check=True).stdout) for _ in range(processes))
    return times[processes // 2]


def call_us(fn) -> float:
    """median_us with rounds of about 0.1 s, sized by the third of three calls (the first ones pay for what
    the process does once)."""
    for _ in range(3):
        start = time.perf_counter()
        fn()
        once = time.perf_counter() - start
    return median_us(fn, calls=max(3, min(2000, int(0.1 / max(once, 1e-7)))))


def layouts(sequences: int, steps: int) -> dict[str, tuple[tuple[int, ...], dict]]:
    """Layout name: (inputs' shape, the other arguments of linrec.linrec)."""
    packed = torch.arange(sequences + 1, dtype=torch.int32) * steps
    return {
        "time last": ((sequences, steps), {}),
        "time first": ((steps, sequences), {"dim": 0}),
        "(1, L, C) dim 1": ((1, steps, sequences), {"dim": 1}),
        "packed": ((1, sequences * steps), {"cu_seqlens": packed}),
    }


def linrec_table(sequence_counts: list[int]) -> None:
    names = list(layouts(1, 1))
    print("| sequences x steps | add | " + " | ".join(names) + " |")
    print("| --- | ---: |" + " ---: |" * len(names))
    for sequences in sequence_counts:
        for steps in (0, 1, 2):
            add_operands = torch.randn(sequences * steps), torch.randn(sequences * steps)
            cells = [f"{call_us(lambda: torch.add(*add_operands)):.1f}"]
            for shape, options in layouts(sequences, steps).values():
                inputs, coeffs = torch.randn(shape, requires_grad=True), torch.rand(shape, requires_grad=True)
                d_outputs = torch.randn(shape)
                with torch.inference_mode():
                    plain_inputs, plain_coeffs = inputs.detach(), coeffs.detach()
                    forward = call_us(lambda: linrec.linrec(plain_inputs, plain_coeffs, **options))
                step = call_us(lambda: torch.autograd.grad(linrec.linrec(inputs, coeffs, **options), (inputs, coeffs),
                                                           d_outputs))
                cells.append(f"{forward:.1f} / {step:.1f}")
            print(f"| {sequences} x {steps} | " + " | ".join(cells) + " |")


def selective_scan_table() -> None:
    torch.manual_seed(0)
    batch, d, n = 1, 512, 16
    print("| length | forward | forward + backward |")
    print("| ---: | ---: | ---: |")
    for length in (1, 16, 256):
        A = -torch.rand(d, n)
        arguments = [torch.randn(batch, d, length), torch.rand(batch, d, length), A, torch.randn(batch, 1, n, length),
                     torch.randn(batch, 1, n, length), torch.randn(d), torch.randn(batch, d, length), torch.randn(d)]
        with torch.inference_mode():
            forward = call_us(lambda: linrec.selective_scan(*arguments, delta_softplus=True))
        leaves = [argument.clone().requires_grad_() for argument in arguments]
        d_out = torch.randn(batch, d, length)
        step = call_us(lambda: torch.autograd.grad(linrec.selective_scan(*leaves, delta_softplus=True), leaves, d_out))
        print(f"| {length} | {forward:.1f} | {step:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", default="8192,32768", help="comma-separated sequence counts C")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"import linrec after import torch: {import_seconds():.3f} s")
    print("\nlinrec.linrec, float32, us: forward without autograd / forward and backward through autograd")
    linrec_table([int(count) for count in args.sequences.split(",")])
    print("\nlinrec.selective_scan, float32, us")
    selective_scan_table()


if __name__ == "__main__":
    main()
