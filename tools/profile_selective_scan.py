"""Runs linrec.selective_scan once on one of tools/bench_selective_scan.py's shapes, for a profiler:

    ncu --kernel-name-base demangled -k regex:ssm:: --metrics ... \
        python tools/profile_selective_scan.py both 8 2048 16 2048

``fwd`` runs the forward alone, ``both`` a forward and a backward (after one forward for the output's
shape); the optional last argument is the dtype (bfloat16 by default).
"""

from __future__ import annotations

import argparse

import torch

import linrec
from bench_selective_scan import arguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("fwd", "both"))
    parser.add_argument("shape", type=int, nargs=4, metavar=("batch", "d", "n", "length"))
    parser.add_argument("dtype", nargs="?", default="bfloat16")
    args = parser.parse_args()
    torch.manual_seed(0)
    tensors = arguments(*args.shape, getattr(torch, args.dtype))
    if args.mode == "fwd":
        with torch.no_grad():
            linrec.selective_scan(*tensors, delta_softplus=True)
    else:
        leaves = [tensor.detach().requires_grad_() for tensor in tensors]
        d_out = torch.randn_like(linrec.selective_scan(*leaves, delta_softplus=True))
        torch.autograd.grad(linrec.selective_scan(*leaves, delta_softplus=True), leaves, d_out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
