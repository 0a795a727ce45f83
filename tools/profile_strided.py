"""One forward and one backward op call per case of bfloat16 (batch, time, channels) along dim 1, for a
profiler (the bulk family on sm_90 and newer), e.g.

    ncu --kernel-name regex:bulk_ --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
        sm__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,\\
        smsp__pcsamp_sample_count,smsp__pcsamp_warps_issue_stalled_wait,... python tools/profile_strided.py
"""

from __future__ import annotations

import torch

import linrec  # noqa: F401  (registers the ops)

#: (shape, packed sequences (0: none), log coefficients)
CASES = [((16, 2048, 1024), 0, False), ((2, 65536, 1024), 0, False), ((4, 16384, 256), 0, False),
         ((16, 2048, 1024), 0, True), ((1, 65536, 1024), 16, False), ((1, 1 << 20, 64), 0, False)]


def main() -> None:
    torch.manual_seed(0)
    for shape, packed, log_coeffs in CASES:
        inputs = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        coeffs = torch.rand(shape, device="cuda", dtype=torch.bfloat16)
        if log_coeffs:
            coeffs = (coeffs.float() * 0.9 + 0.05).log().bfloat16()
        options = dict(dim=1, log_coeffs=log_coeffs)
        if packed:
            cuts = torch.randint(1, shape[1], (packed - 1,)).sort().values
            options["cu_seqlens"] = torch.cat([torch.tensor([0]), cuts, torch.tensor([shape[1]])]).to("cuda", torch.int32)
        outputs = torch.ops.linrec.forward(inputs, coeffs, **options)
        torch.ops.linrec.backward(torch.randn_like(inputs), coeffs, outputs, **options)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
