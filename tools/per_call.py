"""The cost of one call on a tiny tensor, where the host's work is all there is: forward and backward of a
(4, 8) float32 tensor through autograd against the same with torch.mul, and the public forward against
the op called directly. Medians of 7 rounds of 2000 calls, after 200 warm-up calls, in one process
(``median_us`` is the host timer of tools/triton_per_call.py too)."""

import time

import torch

import linrec


def median_us(fn, calls: int = 2000, rounds: int = 7, synchronize=lambda: None) -> float:
    """Median microseconds of host time per call over ``rounds`` rounds of ``calls`` calls, after warm-up;
    ``synchronize`` ends each round (torch.cuda.synchronize on the GPU, where calls are asynchronous)."""
    for _ in range(max(calls // 10, 1)):
        fn()
    synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[rounds // 2] * 1e6


def main() -> None:
    torch.set_num_threads(2)
    inputs = torch.randn(4, 8, requires_grad=True)
    coeffs = torch.rand(4, 8, requires_grad=True)
    d_outputs = torch.randn(4, 8)
    plain_inputs, plain_coeffs = inputs.detach(), coeffs.detach()
    linrec_step = median_us(lambda: torch.autograd.grad(linrec.linrec(inputs, coeffs), (inputs, coeffs), d_outputs))
    mul_step = median_us(lambda: torch.autograd.grad(torch.mul(inputs, coeffs), (inputs, coeffs), d_outputs))
    public = median_us(lambda: linrec.linrec(plain_inputs, plain_coeffs))
    op = median_us(lambda: torch.ops.linrec.forward(plain_inputs, plain_coeffs, -1, False, None, None, False))
    print(f"forward + backward through autograd: linrec {linrec_step:.1f} us, torch.mul {mul_step:.1f} us "
          f"({linrec_step / mul_step:.2f}x)")
    print(f"forward without autograd: linrec.linrec {public:.1f} us, torch.ops.linrec.forward {op:.1f} us "
          f"({public / op:.2f}x)")


if __name__ == "__main__":
    main()
