"""linrec's stand-ins for the Mamba block's functions next to the packages' own, in one process: the causal conv
(``linrec.causal_conv1d`` against causal-conv1d's ``causal_conv1d_fn``) and the whole block from in_proj's
output to out_proj (``linrec.integrations.mamba_inner_fn`` against mamba_ssm's), on Mamba-1 shapes (d_model
768 to 2560, expand 2, d_state 16, conv width 4, dt_rank d_model / 16), batch x length 8 x 2048 and 1 x 16384;
bfloat16 activations under autocast, float32 parameters, as Mamba trains. Prints the forward and the
forward+backward times (medians of triton.testing.do_bench) and the peak memory of a forward+backward beyond
the operands, with linrec's over the package's. Needs a CUDA GPU and triton; causal-conv1d and mamba_ssm where
they import (linrec's rows alone otherwise):

    python tools/bench_mamba_block.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import triton.testing

import linrec
import linrec.integrations


def _peer(module: str, name: str) -> Callable | None:
    """The package's function, or None where it does not import (or is linrec's stand-in)."""
    try:
        package = __import__(module, fromlist=[name])
    except ImportError:
        return None
    function = getattr(package, name, None)
    return None if getattr(function, "__module__", "").startswith("linrec") else function


PEER_CONV = _peer("causal_conv1d", "causal_conv1d_fn")
PEER_INNER = _peer("mamba_ssm.ops.selective_scan_interface", "mamba_inner_fn")
#: (d_model, batch, length)
SHAPES = ((768, 8, 2048), (1536, 8, 2048), (2560, 8, 2048), (2560, 1, 16384))


def measure(call: Callable[[], torch.Tensor], leaves: list[torch.Tensor]) -> dict[str, float]:
    """fwd and fwd+bwd ms, and the peak MiB of a forward+backward beyond what was allocated before it."""
    with torch.no_grad():
        fwd = triton.testing.do_bench(call, return_mode="median")

    def forward_backward():
        out = call()
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    both = triton.testing.do_bench(forward_backward, return_mode="median")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    forward_backward()
    torch.cuda.synchronize()
    return dict(fwd_ms=fwd, fwd_bwd_ms=both, peak_mib=(torch.cuda.max_memory_allocated() - before) / 2**20)


def block_arguments(d_model: int, batch: int, length: int) -> dict[str, torch.Tensor]:
    d, n, width, rank = 2 * d_model, 16, 4, -(-d_model // 16)
    cuda = "cuda"
    return dict(
        xz=torch.randn(batch, 2 * d, length, device=cuda, dtype=torch.bfloat16),
        conv1d_weight=0.3 * torch.randn(d, 1, width, device=cuda), conv1d_bias=torch.randn(d, device=cuda),
        x_proj_weight=torch.randn(rank + 2 * n, d, device=cuda) / d**0.5,
        delta_proj_weight=torch.randn(d, rank, device=cuda) / rank**0.5,
        out_proj_weight=torch.randn(d_model, d, device=cuda) / d**0.5, out_proj_bias=None,
        A=-torch.arange(1, n + 1, device=cuda, dtype=torch.float32).repeat(d, 1),
        D=torch.ones(d, device=cuda), delta_bias=torch.full((d,), -3.0, device=cuda))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    for d_model, batch, length in SHAPES:
        arguments = block_arguments(d_model, batch, length)
        leaves = [t.requires_grad_() for t in arguments.values() if t is not None]
        x = arguments["xz"][:, : 2 * d_model].detach().contiguous().requires_grad_()
        weight = arguments["conv1d_weight"].detach().squeeze(1).requires_grad_()
        bias = arguments["conv1d_bias"].detach().requires_grad_()
        cases = {"conv": (lambda f: lambda: f(x, weight, bias, activation="silu"), [x, weight, bias],
                          linrec.causal_conv1d, PEER_CONV),
                 "block": (lambda f: lambda: _autocast(f, arguments), leaves, linrec.integrations.mamba_inner_fn,
                           PEER_INNER)}
        for name, (make, case_leaves, ours, theirs) in cases.items():
            row = dict(case=name, d_model=d_model, batch=batch, length=length, linrec=measure(make(ours), case_leaves))
            if theirs is not None:
                row["peer"] = measure(make(theirs), case_leaves)
            rows.append(row)
            torch.cuda.empty_cache()
    print("| case | d_model | batch x length | linrec fwd / fwd+bwd ms, peak MiB | package | ratio fwd, f+b, peak |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ours, theirs = row["linrec"], row.get("peer")
        text = f"{ours['fwd_ms']:.3f} / {ours['fwd_bwd_ms']:.3f}, {ours['peak_mib']:.0f}"
        peer = "not installed" if theirs is None else (
            f"{theirs['fwd_ms']:.3f} / {theirs['fwd_bwd_ms']:.3f}, {theirs['peak_mib']:.0f}")
        ratio = "" if theirs is None else ", ".join(
            f"{ours[key] / theirs[key]:.2f}" for key in ("fwd_ms", "fwd_bwd_ms", "peak_mib"))
        print(f"| {row['case']} | {row['d_model']} | {row['batch']} x {row['length']} | {text} | {peer} | {ratio} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


def _autocast(function: Callable, arguments: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return function(**arguments)


if __name__ == "__main__":
    main()
