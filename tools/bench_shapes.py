"""Ratio to torch.add of the compiled kernels on a few shapes, for quick A/B runs on the GPU machine
(python -m linrec bench measures the full tables with the references):

    python tools/bench_shapes.py [--backend auto|triton] [--dtypes float32,bfloat16] [--coeff-range 0,1]
        [--config A,B] [--api] SHAPE:DIM[:COEFFS] ...

SHAPE and COEFFS are 'x'-separated sizes, e.g. 8x4096x4096:1 or 13200x4096:-1:13200x1. The ops are
called directly; with --api, through linrec.linrec as a user calls it: the forward without autograd, and
forward and backward through autograd against 8/3 of an add's time (where host time shows on small shapes).
"""

from __future__ import annotations

import argparse

import torch

import linrec
from linrec._core.autograd import COMPILED, TRITON
from linrec.tools.bench import timer


def parse(case: str):
    parts = case.split(":")
    shape = tuple(int(n) for n in parts[0].split("x"))
    dim = int(parts[1]) if len(parts) > 1 else -1
    coeffs_shape = tuple(int(n) for n in parts[2].split("x")) if len(parts) > 2 else shape
    return shape, dim, coeffs_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--backend", default="auto", choices=["auto", "triton"], help="compiled or Triton kernels")
    parser.add_argument("--config", default="0,0", help="threads_per_sequence,vectors_per_thread, or for triton "
                        "block_length,block_channels (0,0: automatic)")
    parser.add_argument("--coeff-range", default="0,1",
                        help="LOW,HIGH: coefficients uniform in [LOW, HIGH) (near 1, chunks' maps are not constant)")
    parser.add_argument("--api", action="store_true", help="time the public API, with autograd for the backward")
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    time_ms = timer(torch.device("cuda"))
    kernels = TRITON if args.backend == "triton" else COMPILED
    config = [int(n) for n in args.config.split(",")]
    low, high = (float(n) for n in args.coeff_range.split(","))
    print(f"{'dtype':>8} {'case':>24} {'fwd x add':>9} {'fwd+bwd x add' if args.api else 'bwd x add':>9}")
    for dtype in [getattr(torch, name) for name in args.dtypes.split(",")]:
        for case in args.cases:
            shape, dim, coeffs_shape = parse(case)
            inputs = torch.randn(shape, device="cuda", dtype=dtype)
            coeffs = torch.empty(coeffs_shape, device="cuda", dtype=dtype).uniform_(low, high)
            full_coeffs = torch.rand_like(inputs)
            d_outputs = torch.randn_like(inputs)
            outputs = kernels.forward(inputs, coeffs, dim)
            add_ms = time_ms(lambda: torch.add(inputs, full_coeffs))
            if args.api:
                leaves = (inputs.clone().requires_grad_(), coeffs.clone().requires_grad_())
                forward_ms = time_ms(lambda: linrec.linrec(inputs, coeffs, dim, backend=args.backend))
                step_ms = time_ms(lambda: torch.autograd.grad(linrec.linrec(*leaves, dim, backend=args.backend),
                                                              leaves, d_outputs))
                backward = 8 / 3 * add_ms / step_ms
            else:
                forward_ms = time_ms(lambda: kernels.forward(inputs, coeffs, dim, False, None, None, False, *config))
                backward_ms = time_ms(
                    lambda: kernels.backward(d_outputs, coeffs, outputs, dim, False, None, None, False, *config))
                backward = 5 / 3 * add_ms / backward_ms
            print(f"{str(dtype).removeprefix('torch.'):>8} {case:>24} {add_ms / forward_ms:>9.2f} {backward:>9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
