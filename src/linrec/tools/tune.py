"""Times every compiled CUDA kernel config on the shapes of the benchmark and reports the best one
next to the config the launcher picks by itself.

    python -m linrec tune [--dtypes float32,bfloat16] [--out bench-results]

Configs are forced through the ops' threads_per_sequence and vectors_per_thread arguments. The
launcher's choice (csrc/kernels/cuda/pipe_scan.cu, choose_config) is a heuristic; this report is
how it is checked and revised.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from .._core.runtime import build_info
from .bench import BENCH_DTYPES, gpu_shapes, parse_dtypes, timer
from .guard import check_device

_TILES = build_info().get("pipe_tile_shapes") or {"row": [], "chained": [], "strided": []}
#: (threads per sequence, 16-byte vectors per thread) as the build record has them: the row tiles of the
#: CUDA pipes (vectors of the dtype), then the chained tile (one tile per block chained across blocks
#: by look-back; vectors of the accumulator type: float32 for the 16-bit types). Empty without CUDA kernels.
CHAINED_TILE_SHAPE = tuple(_TILES["chained"][0]) if _TILES["chained"] else None
TILE_SHAPES = [tuple(shape) for shape in _TILES["row"]] + ([CHAINED_TILE_SHAPE] if CHAINED_TILE_SHAPE else [])
#: The tile shapes of the backward kernels for packed sequences (cu_seqlens) and for coefficients whose
#: gradient the kernel sums (broadcast ones): the largest row tile and the chained one.
PACKED_BACKWARD_TILE_SHAPES = TILE_SHAPES[-2:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m linrec tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help=f"comma-separated, of {','.join(BENCH_DTYPES)} (default: float32,bfloat16)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    dtypes = parse_dtypes(parser, args.dtypes)
    check_device(parser, "cuda", why="it times linrec's CUDA kernels")
    device = torch.device("cuda")
    time_ms = timer(device)
    rows = []
    print(f"{'dtype':>8} {'shape':>14} {'dir':>3} {'auto x add':>10} {'best x add':>10} {'best config':>12}")
    for dtype in dtypes:
        for sequences, length in gpu_shapes(device):
            inputs = torch.randn(sequences, length, device=device, dtype=dtype)
            coeffs = torch.rand_like(inputs)
            d_outputs = torch.randn_like(inputs)
            outputs = torch.ops.linrec.forward(inputs, coeffs)
            add_ms = time_ms(lambda: torch.add(inputs, coeffs))
            calls = {
                "fwd": (3, lambda *config: torch.ops.linrec.forward(inputs, coeffs, -1, False, None, None, False, *config)),
                "bwd": (5, lambda *config: torch.ops.linrec.backward(d_outputs, coeffs, outputs, -1, False, None, None, False, *config)),
            }
            for direction, (tensors, call) in calls.items():
                ratio = {}
                for config in [(0, 0), *TILE_SHAPES]:
                    ms = time_ms(lambda: call(*config))
                    ratio[config] = tensors / 3 * add_ms / ms
                    rows.append(dict(dtype=str(dtype).removeprefix("torch."), sequences=sequences, length=length,
                                     direction=direction, threads_per_sequence=config[0],
                                     vectors_per_thread=config[1], ms=ms, ratio_to_add=ratio[config]))
                best = max(TILE_SHAPES, key=ratio.get)
                print(f"{rows[-1]['dtype']:>8} {f'{sequences}x{length}':>14} {direction:>3} {ratio[(0, 0)]:>10.2f} "
                      f"{ratio[best]:>10.2f} {str(best):>12}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "linrec-tune.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
