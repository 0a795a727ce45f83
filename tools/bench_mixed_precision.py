"""Mixed precision on the GPU: 16-bit inputs with coefficients of their dtype and with float32
coefficients, through the public API with autograd, as ratios to torch.add on the inputs' operands
(forward; backward against 5/3 of torch.add, its 5 tensors against add's 3):

    python tools/bench_mixed_precision.py [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch

import linrec
from linrec.tools.bench import timer

# (shape, dim, coeffs shape): per-step gates along a strided and a contiguous time dim, per-channel decays.
CASES = [((16, 2048, 1024), 1, (16, 2048, 1024)), ((16, 2048, 1024), 1, (1024,)),
         ((64, 1024, 4096), -1, (64, 1024, 4096)), ((8, 4096, 2048), 1, (8, 4096, 2048))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    dtype = getattr(torch, parser.parse_args().dtype)
    time_ms = timer(torch.device("cuda"))
    print(f"{'shape':>18} {'dim':>3} {'coeffs':>18} {'coeffs dtype':>14} {'fwd x add':>9} {'bwd x add':>9}")
    for shape, dim, coeffs_shape in CASES:
        inputs = torch.randn(shape, device="cuda", dtype=dtype)
        other = torch.randn_like(inputs)
        add_ms = time_ms(lambda: torch.add(inputs, other))
        for coeff_dtype in (dtype, torch.float32):
            coeffs = torch.empty(coeffs_shape, device="cuda").uniform_(0.9, 1.0).to(coeff_dtype)
            forward_ms = time_ms(lambda: linrec.linrec(inputs, coeffs, dim=dim))
            leaves = (inputs.clone().requires_grad_(), coeffs.clone().requires_grad_())
            outputs = linrec.linrec(*leaves, dim=dim)
            d_outputs = torch.randn_like(outputs)
            backward_ms = time_ms(lambda: torch.autograd.grad(outputs, leaves, d_outputs, retain_graph=True))
            print(f"{str(shape):>18} {dim:>3} {str(coeffs_shape):>18} {str(coeff_dtype).removeprefix('torch.'):>14} "
                  f"{add_ms / forward_ms:>9.2f} {5 / 3 * add_ms / backward_ms:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
