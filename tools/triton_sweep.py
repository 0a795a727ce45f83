"""Ratio to torch.add of the Triton kernels under variants of their tuning data (_core/triton/configs.py),
on the GPU machine: each variant replaces module constants, then times forward and backward of every
shape with the tiles the heuristic then chooses.

    python tools/triton_sweep.py [--dtypes float32] --cases SHAPE:DIM ... -- 'TILE_ELEMENTS=1024;WARPS_BY_TILE={0:1,512:4}' ...
"""

from __future__ import annotations

import argparse
import ast

import torch

from linrec._core.autograd import TRITON
from linrec._core.triton import configs
from linrec.tools.bench import timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--cases", nargs="+", required=True, help="SHAPE:DIM, e.g. 16x2048x1024:1")
    parser.add_argument("variants", nargs="+", help="NAME=VALUE;... per variant ('' for the defaults)")
    args = parser.parse_args()
    variants, cases = args.variants, args.cases
    time_ms = timer(torch.device("cuda"))
    defaults = {name: getattr(configs, name) for name in dir(configs) if name.isupper()}
    for variant in variants:
        settings = dict(defaults)
        for assignment in filter(None, variant.split(";")):
            name, value = assignment.split("=", 1)
            settings[name.strip()] = ast.literal_eval(value)
        for name, value in settings.items():
            setattr(configs, name, value)
        print(f"== {variant}", flush=True)
        for dtype in [getattr(torch, name) for name in args.dtypes.split(",")]:
            for case in cases:
                shape_text, dim = case.split(":")
                shape = tuple(int(n) for n in shape_text.split("x"))
                inputs = torch.randn(shape, device="cuda", dtype=dtype)
                coeffs, d_outputs = torch.rand_like(inputs), torch.randn_like(inputs)
                outputs = TRITON.forward(inputs, coeffs, int(dim))
                add_ms = time_ms(lambda: torch.add(inputs, coeffs))
                fwd = add_ms / time_ms(lambda: TRITON.forward(inputs, coeffs, int(dim)))
                bwd = 5 / 3 * add_ms / time_ms(lambda: TRITON.backward(d_outputs, coeffs, outputs, int(dim)))
                print(f"{str(dtype).removeprefix('torch.'):>8} {case:>22} {fwd:6.2f} {bwd:6.2f}", flush=True)


if __name__ == "__main__":
    main()
