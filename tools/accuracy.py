"""Error of linrec against the float64 loop, next to the float32 loop's, on long rows with decays near 1
(one decay a row, broadcast along time, or a new coefficient every step):

    python tools/accuracy.py [--device cuda] [--backend auto|triton] [--rows 8] [--length 16777216]

Errors are max |y - y64| / max |y64| per row. The loops run on the CPU: time-strided operands, which the
CPU kernels scan step after step (one fused multiply-add a step).
"""

from __future__ import annotations

import argparse

import torch

import linrec

DECAYS = [0.999, 0.9999, 0.99999, 0.999999, 1.0]


def sequential_loop(inputs: torch.Tensor, coeffs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    time_first = lambda t: t.expand_as(inputs).cpu().to(dtype).T.contiguous()  # noqa: E731
    return torch.ops.linrec.forward(time_first(inputs), time_first(coeffs), 0).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--rows", type=int, default=len(DECAYS))
    parser.add_argument("--length", type=int, default=1 << 24)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows, length = args.rows, args.length
    inputs = torch.randn(rows, length)
    decays = torch.tensor((DECAYS * (rows // len(DECAYS) + 1))[:rows])[:, None]
    for kind, coeffs in (("per row", decays), ("expanded", decays.expand(rows, length).contiguous()),
                         ("per step", torch.empty(rows, length).uniform_(0.999, 1.0))):
        exact = sequential_loop(inputs, coeffs, torch.float64)
        scale = exact.abs().amax(dim=1, keepdim=True)
        errors = lambda y: ((y.cpu().double() - exact).abs() / scale).amax(dim=1)  # noqa: E731
        loop = errors(sequential_loop(inputs, coeffs, torch.float32))
        ours = errors(linrec.linrec(inputs.to(args.device), coeffs.to(args.device), backend=args.backend))
        for decay in DECAYS if kind != "per step" else [None]:
            rows_of = slice(None) if decay is None else decays[:, 0] == torch.tensor(decay, dtype=decays.dtype)
            label = "[0.999, 1)" if decay is None else f"{decay:.6f}"
            mine, theirs = ours[rows_of].max().item(), loop[rows_of].max().item()
            print(f"{args.device} {args.backend} {rows}x{length} {kind:8s} coeffs {label}: linrec {mine:.2e} "
                  f"loop {theirs:.2e} ratio {mine / theirs:.2f}", flush=True)

if __name__ == "__main__":
    main()
