"""linrec.selective_state_update (the decode step) next to mamba_ssm's selective_state_update (its Triton
kernel), in one process, on the decode shapes of Mamba-1 (state (batch, d, n): d in {2048, 5120}, n = 16)
and of Mamba-2's heads (state (batch, heads, 64, n): 80 heads, n = 128, B and C in 1 or 8 groups, A, dt, D
and dt_bias a scalar per head expanded as Mamba-2 passes them), batch 1 to 256; x, dt, z, B and C in
bfloat16, the state, A, D and dt_bias float32; z, dt_bias and softplus. Times are the medians of
triton.testing.do_bench over calls as a decode loop makes them (the host's work included), each step
updating its own copy of the state. Needs a CUDA GPU and triton; mamba_ssm where it is importable:

    python tools/bench_state_update.py [--json FILE]

Prints a Markdown table (docs/benchmarks.md, Decode step).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

import linrec

try:
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update as mamba_step
except ImportError:  # mamba_ssm not installed: linrec's times alone
    mamba_step = None

BATCHES = (1, 4, 16, 64, 256)
# (layout, d or heads, n, groups)
LAYOUTS = (("mamba1", 2048, 16, 1), ("mamba1", 5120, 16, 1), ("mamba2", 80, 128, 1), ("mamba2", 80, 128, 8))
HEAD_DIM = 64


def arguments(layout: str, batch: int, channels: int, n: int, groups: int) -> dict[str, torch.Tensor]:
    """state, x, dt, A, B, C, D, z, dt_bias of one decode step, as Mamba-1 or Mamba-2 passes them."""
    cuda, bf16 = "cuda", torch.bfloat16
    if layout == "mamba1":
        per_channel = (batch, channels)
        return dict(state=torch.randn(batch, channels, n, device=cuda),
                    x=torch.randn(per_channel, device=cuda, dtype=bf16),
                    dt=(0.5 * torch.randn(per_channel, device=cuda) - 1).to(bf16),
                    A=-(0.5 + torch.rand(channels, n, device=cuda)),
                    B=torch.randn(batch, n, device=cuda, dtype=bf16), C=torch.randn(batch, n, device=cuda, dtype=bf16),
                    D=torch.randn(channels, device=cuda), z=torch.randn(per_channel, device=cuda, dtype=bf16),
                    dt_bias=0.3 * torch.randn(channels, device=cuda))
    heads = channels
    per_head = (batch, heads, HEAD_DIM)
    return dict(state=torch.randn(batch, heads, HEAD_DIM, n, device=cuda),
                x=torch.randn(per_head, device=cuda, dtype=bf16),
                dt=(0.5 * torch.randn(batch, heads, 1, device=cuda) - 1).to(bf16).expand(per_head),
                A=-(0.5 + torch.rand(heads, 1, 1, device=cuda)).expand(heads, HEAD_DIM, n),
                B=torch.randn(batch, groups, n, device=cuda, dtype=bf16),
                C=torch.randn(batch, groups, n, device=cuda, dtype=bf16),
                D=torch.randn(heads, 1, device=cuda).expand(heads, HEAD_DIM),
                z=torch.randn(per_head, device=cuda, dtype=bf16),
                dt_bias=0.3 * torch.randn(heads, 1, device=cuda).expand(heads, HEAD_DIM))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    print("| layout | batch | channels or heads | n | groups | linrec us | mamba_ssm us | ratio | max diff (out, state) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for layout, channels, n, groups in LAYOUTS:
        for batch in BATCHES:
            operands = arguments(layout, batch, channels, n, groups)
            mine, theirs = operands["state"].clone(), operands["state"].clone()
            rest = {name: value for name, value in operands.items() if name != "state"}
            with torch.no_grad():
                def ours():
                    return linrec.selective_state_update(mine, **rest, dt_softplus=True)
                linrec_us = 1e3 * triton.testing.do_bench(ours, warmup=25, rep=200, return_mode="median")
                mamba_us = difference = None
                if mamba_step is not None:
                    def peer():
                        return mamba_step(theirs, **rest, dt_softplus=True)
                    reference = operands["state"].clone()
                    peer_out = mamba_step(reference, **rest, dt_softplus=True)
                    start = operands["state"].clone()
                    out = linrec.selective_state_update(start, **rest, dt_softplus=True)
                    difference = ((out.float() - peer_out.float()).abs().max().item(),
                                  (start - reference).abs().max().item())
                    mamba_us = 1e3 * triton.testing.do_bench(peer, warmup=25, rep=200, return_mode="median")
            row = dict(layout=layout, batch=batch, channels=channels, n=n, groups=groups, linrec_us=linrec_us,
                       mamba_us=mamba_us, difference=difference)
            rows.append(row)
            ratio = f"{linrec_us / mamba_us:.2f}" if mamba_us else "-"
            peer_text = f"{mamba_us:.1f}" if mamba_us else "-"
            diff_text = f"{difference[0]:.2g}, {difference[1]:.2g}" if difference else "-"
            print(f"| {layout} | {batch} | {channels} | {n} | {groups} | {linrec_us:.1f} | {peer_text} | {ratio} | "
                  f"{diff_text} |", flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
