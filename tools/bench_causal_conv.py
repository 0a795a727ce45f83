"""linrec.causal_conv1d next to causal-conv1d's causal_conv1d_fn (its CUDA kernels), in one process: widths 2 to
4, bfloat16, float32 and float16, bias and SiLU, x time-last ((batch, dim, length), as Mamba's block passes it)
and channel-last (the first dim channels of a (batch, length, 2 dim) projection, transposed, as transformers'
Mamba passes it); long rows, odd lengths and short rows. Times are the medians of triton.testing.do_bench over
calls through the public API (the host's work included): the forward without autograd, and the backward of a
recorded forward (gradients of x, weight and bias). torch.add of two tensors of x's shape, in the same
process, is the scale. Needs a CUDA GPU and triton; causal-conv1d where it is importable:

    python tools/bench_causal_conv.py [--json FILE]

Prints a line a row (docs/benchmarks.md, Causal conv), with the largest difference from causal-conv1d's output.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

import linrec

try:
    from causal_conv1d import causal_conv1d_fn as peer_conv
except ImportError:  # causal-conv1d not installed: linrec's times alone
    peer_conv = None

#: (batch, dim, length)
SHAPES = ((8, 3072, 2048), (8, 5120, 2048), (1, 4096, 16384), (4, 1536, 1000), (2, 2560, 4097), (64, 3072, 128))
DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def make_x(batch: int, dim: int, length: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    if layout == "time-last":
        return torch.randn(batch, dim, length, device="cuda", dtype=dtype)
    return torch.randn(batch, length, 2 * dim, device="cuda", dtype=dtype)[..., :dim].transpose(1, 2)


def measure(conv, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[float, float]:
    """(forward ms, backward ms) of conv(x, weight, bias) with SiLU."""
    with torch.no_grad():
        forward = triton.testing.do_bench(lambda: conv(x, weight, bias), return_mode="median")
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = conv(*leaves)
    d_out = torch.randn_like(out)
    backward = triton.testing.do_bench(lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True),
                                       return_mode="median")
    return forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    convs = {"linrec": lambda x, w, b: linrec.causal_conv1d(x, w, b, "silu")}
    if peer_conv is not None:
        convs["causal-conv1d"] = lambda x, w, b: peer_conv(x, w, b, activation="silu")
    rows = []
    for layout in ("time-last", "channel-last"):
        for dtype in DTYPES:
            for width in (2, 3, 4):
                for batch, dim, length in SHAPES:
                    x = make_x(batch, dim, length, dtype, layout)
                    weight = torch.randn(dim, width, device="cuda")
                    bias = torch.randn(dim, device="cuda")
                    y = torch.randn(batch, dim, length, device="cuda", dtype=dtype)
                    add = triton.testing.do_bench(lambda: torch.add(y, y), return_mode="median")
                    row = dict(layout=layout, dtype=str(dtype).removeprefix("torch."), width=width,
                               shape=f"{batch}x{dim}x{length}", add_ms=add)
                    for name, conv in convs.items():
                        row[name] = dict(zip(("fwd_ms", "bwd_ms"), measure(conv, x, weight, bias)))
                    text = (f"{layout:12} {row['dtype']:8} w{width} {row['shape']:>14}  add {add * 1e3:6.1f} us | "
                            + " | ".join(f"{name} fwd {row[name]['fwd_ms'] * 1e3:6.1f} us ({add / row[name]['fwd_ms']:.2f}"
                                         f" x add), bwd {row[name]['bwd_ms'] * 1e3:6.1f} us" for name in convs))
                    if peer_conv is not None:
                        with torch.no_grad():
                            difference = (convs["linrec"](x, weight, bias).float()
                                          - convs["causal-conv1d"](x, weight, bias).float()).abs().max().item()
                        row["max_difference"] = difference
                        text += f" | difference {difference:.1e}"
                    print(text, flush=True)
                    rows.append(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
