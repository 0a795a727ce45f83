"""Host time of one call of the Triton backend on a tiny GPU tensor, where the host's work is all there
is: the forward op, the backward op, and forward+backward through the public API with autograd, next
to the compiled CUDA kernels' (medians of 5 rounds of 500 calls, synchronized once per round)."""

import torch
from per_call import median_us as host_us  # tools/ is on the path of a script run from it

from linrec import linrec
from linrec._core.autograd import COMPILED, TRITON


def median_us(fn) -> float:
    return host_us(fn, calls=500, rounds=5, synchronize=torch.cuda.synchronize)


def main() -> None:
    inputs = torch.randn(4, 8, 16, device="cuda", requires_grad=True)
    coeffs = torch.rand(16, device="cuda", requires_grad=True)
    d_outputs = torch.randn_like(inputs)
    plain = inputs.detach()
    print(f"{'':>10} {'fwd op us':>10} {'bwd op us':>10} {'API fwd+bwd us':>15}")
    for name, kernels, backend in (("compiled", COMPILED, "auto"), ("triton", TRITON, "triton")):
        outputs = kernels.forward(plain, coeffs.detach(), 1)
        forward = median_us(lambda: kernels.forward(plain, coeffs.detach(), 1))
        backward = median_us(lambda: kernels.backward(d_outputs, coeffs.detach(), outputs, 1))
        step = median_us(lambda: torch.autograd.grad(linrec(inputs, coeffs, 1, backend=backend), (inputs, coeffs),
                                                     d_outputs))
        print(f"{name:>10} {forward:>10.1f} {backward:>10.1f} {step:>15.1f}")


if __name__ == "__main__":
    main()
