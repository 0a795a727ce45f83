"""Benchmark guard: a fixed grid over every kernel family and path, timed against torch.add, compared with
baselines to flag regressions.

    python -m linrec bench --suite guard [--quick] [--device cpu|cuda] [--out FILE.csv]
                                         [--compare BASELINE.csv ...] [--repeats R] [--threads N]
                                         [--floor FRACTION] [--fail-on-regression]
    python src/linrec/tools/guard.py ...   (the same, against whichever linrec build is importable)

Every row's metric is its throughput over torch.add's on two inputs-sized tensors, measured in the same
process just before it (forward calls count 3 tensors of bytes, backward calls 5, torch.add 3), or, for
tiny calls, microseconds per call (lower is better). Each row is measured in R repeats, the repeats
interleaved across the grid, and reported as the median with the range (low, high) of its repeats. A row
is flagged slower when its median is below the baseline's by more than the floor (5 % on the GPU, 10 % on
the CPU and for tiny calls) and its whole range lies below the baseline's; flagged rows are measured
again with more repeats before they are reported.

This file imports only torch, linrec's public API and (optionally) triton, so that it also measures
older builds of linrec, whose private modules differ: a row whose API a build lacks is reported as
skipped.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import torch

import linrec
import linrec.rl

#: Timed modes. "ops": torch.ops.linrec.forward / .backward called directly; "api": linrec.linrec (or the
#: row's public function) on leaves that require grad, and torch.autograd.grad of one recorded forward.
OPS_MODES = ("ops-fwd", "ops-bwd")
API_MODES = ("api-fwd", "api-bwd")
#: Bytes a call counts, in inputs-sized tensors: forward reads inputs and coeffs and writes outputs;
#: backward reads d_outputs, coeffs and outputs and writes d_inputs and d_coeffs. torch.add moves 3.
MODE_TENSORS = {"ops-fwd": 3, "ops-bwd": 5, "api-fwd": 3, "api-bwd": 5}
ADD_TENSORS = 3

#: Metrics: throughput over torch.add's (higher is better), or microseconds per call (lower is better).
RATIO = "x add"
MICROSECONDS = "us"

#: A row is slower or faster only beyond this fraction of the baseline, whatever the measured spread.
FLOOR = {"cuda": 0.05, "cpu": 0.10}
#: Tiny calls are bound by the host on either device, where timings move as on the CPU.
PER_CALL_FLOOR = 0.10
DEFAULT_REPEATS = 3
#: Repeats of the second measurement of a flagged row.
REMEASURE_REPEATS = 5

#: The CPU timer's wall-clock budget per measurement, and the shortest sample: calls shorter than it are
#: timed in batches, so that perf_counter's resolution and overhead stay negligible.
CPU_BUDGET_S = 0.12
MIN_SAMPLE_S = 1e-3

CSV_COLUMNS = ("device", "name", "dtype", "mode", "shape", "metric", "median", "low", "high", "repeats", "note")

Timer = Callable[[Callable[[], object]], float]  # milliseconds per call of a function


class Workload(NamedTuple):
    """One case's operands, freshly allocated, and its calls."""

    #: torch.add on two inputs-sized tensors: the reference of the RATIO metric (None for tiny calls).
    add: Callable[[], object] | None
    #: mode -> a function that prepares the timed call (records the forward a backward needs) and returns it.
    modes: dict[str, Callable[[], Callable[[], object]]]


@dataclass(frozen=True, kw_only=True)
class Case:
    """One entry of the grid; each of its modes is a row of the guard's table."""

    name: str
    dtype: torch.dtype = torch.float32
    #: In the --quick subset.
    quick: bool = False

    @property
    def modes(self) -> tuple[str, ...]:
        return API_MODES

    @property
    def metric(self) -> str:
        return RATIO

    def shape_text(self) -> str:
        raise NotImplementedError

    def workload(self, device: torch.device) -> Workload:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ScanCase(Case):
    """linrec on one layout: the ops called directly and the public API with autograd."""

    shape: tuple[int, ...]
    dim: int = -1
    #: None: the inputs' shape; () a 0-dim scalar; else a shape that broadcasts to the inputs'.
    coeffs_shape: tuple[int, ...] | None = None
    #: None: the inputs' dtype (float32 with 16-bit inputs: mixed precision).
    coeffs_dtype: torch.dtype | None = None
    reverse: bool = False
    initial: bool = False
    log_coeffs: bool = False
    #: Packed: this many sequences of random unequal lengths along dim (cu_seqlens), one empty with empty.
    sequences: int | None = None
    empty: bool = False
    #: "nan": every input NaN; "inf": one Inf, at the first step of the first sequence.
    nonfinite: str | None = None
    #: linrec.linrec's backend: other than "auto", the API modes only (the ops are the compiled kernels').
    backend: str = "auto"
    #: A tiny call: microseconds per call instead of a ratio.
    per_call: bool = False

    @property
    def modes(self) -> tuple[str, ...]:
        return API_MODES if self.backend != "auto" else OPS_MODES + API_MODES

    @property
    def metric(self) -> str:
        return MICROSECONDS if self.per_call else RATIO

    def shape_text(self) -> str:
        text = "x".join(map(str, self.shape))
        return text if self.dim % len(self.shape) == len(self.shape) - 1 else f"{text}:{self.dim}"

    def workload(self, device: torch.device) -> Workload:
        dim = self.dim % len(self.shape)
        inputs = torch.randn(self.shape, device=device, dtype=self.dtype)
        if self.nonfinite == "nan":
            inputs.fill_(math.nan)
        elif self.nonfinite == "inf":
            inputs[(0,) * inputs.dim()] = math.inf  # the first step of the first sequence: the rest of it is Inf
        coeffs_dtype = self.coeffs_dtype or self.dtype
        coeffs = torch.rand(self.shape if self.coeffs_shape is None else self.coeffs_shape, device=device,
                            dtype=coeffs_dtype)
        if coeffs_dtype.is_complex:
            coeffs *= 0.7  # |c| < 1, as for real coefficients in [0, 1)
        if self.log_coeffs:
            coeffs = -coeffs  # log c in (-1, 0]: c in (0.37, 1]
        initial = None
        if self.initial:
            initial = torch.randn([size for axis, size in enumerate(self.shape) if axis != dim], device=device,
                                  dtype=self.dtype)
        cu_seqlens = None
        if self.sequences is not None:
            cu_seqlens = packed_offsets(self.shape[dim], self.sequences, self.empty).to(device)
        d_outputs = torch.randn_like(inputs)
        arguments = (dim, self.reverse, initial, cu_seqlens, self.log_coeffs)
        # The ops get detached operands; the API leaves of their own, which alias them.
        leaves = [tensor.detach().requires_grad_() for tensor in (inputs, coeffs, initial) if tensor is not None]
        # Only the options a row sets are passed to linrec.linrec: a build without one skips that row alone.
        options: dict[str, object] = {}
        if self.reverse:
            options["reverse"] = True
        if initial is not None:
            options["initial"] = leaves[2]
        if cu_seqlens is not None:
            options["cu_seqlens"] = cu_seqlens
        if self.log_coeffs:
            options["log_coeffs"] = True
        if self.backend != "auto":
            options["backend"] = self.backend

        def api_forward() -> torch.Tensor:
            return linrec.linrec(leaves[0], leaves[1], self.dim, **options)

        def ops_backward() -> Callable[[], object]:
            outputs = torch.ops.linrec.forward(inputs, coeffs, *arguments)
            return lambda: torch.ops.linrec.backward(d_outputs, coeffs, outputs, *arguments)

        def api_backward() -> Callable[[], object]:
            outputs = api_forward()
            return lambda: torch.autograd.grad(outputs, leaves, d_outputs, retain_graph=True)

        modes = {
            "ops-fwd": lambda: lambda: torch.ops.linrec.forward(inputs, coeffs, *arguments),
            "ops-bwd": ops_backward,
            "api-fwd": lambda: api_forward,
            "api-bwd": api_backward,
        }
        add = None if self.per_call else lambda: torch.add(inputs, d_outputs)
        return Workload(add, {mode: modes[mode] for mode in self.modes})


@dataclass(frozen=True, kw_only=True)
class GaeCase(Case):
    """linrec.rl.gae on (time, environments) rollouts, time along dim 0, some episodes ending; its forward
    on values that require grad and the values' gradient of the advantages. Bytes are counted as linrec's
    on the rewards' size (3 forward, 5 backward): a fixed scale, not the traffic of its several ops."""

    shape: tuple[int, int]

    def shape_text(self) -> str:
        return "x".join(map(str, self.shape)) + ":0"

    def workload(self, device: torch.device) -> Workload:
        steps, environments = self.shape
        rewards = torch.randn(self.shape, device=device, dtype=self.dtype)
        values = torch.randn(steps + 1, environments, device=device, dtype=self.dtype).requires_grad_()
        dones = torch.rand(self.shape, device=device) < 0.01
        d_advantages = torch.randn_like(rewards)

        def forward() -> torch.Tensor:
            return linrec.rl.gae(rewards, values, dones, 0.99, 0.95)[0]

        def backward() -> Callable[[], object]:
            advantages = forward()
            return lambda: torch.autograd.grad(advantages, values, d_advantages, retain_graph=True)

        return Workload(lambda: torch.add(rewards, d_advantages), {"api-fwd": lambda: forward, "api-bwd": backward})


@dataclass(frozen=True, kw_only=True)
class SelectiveScanCase(Case):
    """linrec.selective_scan (Mamba's S6) with D, z, delta_bias and softplus: u, delta and z (batch, d, length)
    in the dtype, A (d, n), D and delta_bias float32; B and C time-varying (batch, n, length) in the dtype,
    or constant (d, n) float32. Forward on leaves that require grad, and the gradients of all eight. Bytes
    are counted as linrec's on u's size (3 forward, 5 backward): a fixed scale."""

    batch: int
    d: int
    n: int
    length: int
    constant_bc: bool = False

    def shape_text(self) -> str:
        return f"{self.batch}x{self.d}x{self.n}x{self.length}"

    def workload(self, device: torch.device) -> Workload:
        activations = (self.batch, self.d, self.length)
        projection = (self.d, self.n) if self.constant_bc else (self.batch, self.n, self.length)
        projection_dtype = torch.float32 if self.constant_bc else self.dtype
        arguments = dict(
            u=torch.randn(activations, device=device, dtype=self.dtype),
            delta=torch.randn(activations, device=device, dtype=self.dtype) - 1,  # softplus: about 0.3
            A=-torch.rand(self.d, self.n, device=device) - 0.5,
            B=torch.randn(projection, device=device, dtype=projection_dtype),
            C=torch.randn(projection, device=device, dtype=projection_dtype),
            D=torch.randn(self.d, device=device),
            z=torch.randn(activations, device=device, dtype=self.dtype),
            delta_bias=0.1 * torch.randn(self.d, device=device),
        )
        leaves = [tensor.requires_grad_() for tensor in arguments.values()]
        d_out = torch.randn(activations, device=device, dtype=self.dtype)

        def forward() -> torch.Tensor:
            return linrec.selective_scan(**arguments, delta_softplus=True)

        def backward() -> Callable[[], object]:
            out = forward()
            return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)

        return Workload(lambda: torch.add(arguments["u"].detach(), d_out), {"api-fwd": lambda: forward,
                                                                              "api-bwd": backward})


@dataclass(frozen=True, kw_only=True)
class StateUpdateCase(Case):
    """linrec.selective_state_update (the decode step) with D, z, dt_bias and softplus, outside autograd: the
    state (batch, d, n) float32, x, dt and z (batch, d) and B and C (batch, n) in the dtype. The step reads and
    writes the state: bytes are counted as 3 state-sized tensors, torch.add's on two of them (a fixed scale).
    A build without the step skips the row."""

    batch: int
    d: int
    n: int

    @property
    def modes(self) -> tuple[str, ...]:
        return ("api-fwd",)

    def shape_text(self) -> str:
        return f"{self.batch}x{self.d}x{self.n}"

    def workload(self, device: torch.device) -> Workload:
        state = torch.randn(self.batch, self.d, self.n, device=device)
        per_channel = (self.batch, self.d)
        x, dt, z = (torch.randn(per_channel, device=device, dtype=self.dtype) for _ in range(3))
        B, C = (torch.randn(self.batch, self.n, device=device, dtype=self.dtype) for _ in range(2))
        A = -torch.rand(self.d, self.n, device=device) - 0.5
        D, dt_bias = torch.randn(self.d, device=device), 0.1 * torch.randn(self.d, device=device)

        def step() -> torch.Tensor:
            with torch.no_grad():
                return linrec.selective_state_update(state, x, dt - 1, A, B, C, D, z, dt_bias, True)

        return Workload(lambda: torch.add(state, state), {"api-fwd": lambda: step})


@dataclass(frozen=True, kw_only=True)
class CausalConvCase(Case):
    """linrec.causal_conv1d (Mamba's causal conv) with a bias and SiLU: x (batch, d, length) in the dtype, the
    weight (d, width) and bias float32; ``sequences`` packed along the length (batch 1) where given. Forward on
    leaves that require grad, and the gradients of x, weight and bias. ``channel_last``: x the first d channels of
    a (batch, length, 2 d) projection, transposed (transformers' Mamba layout). A build without the conv skips the
    row."""

    batch: int
    d: int
    length: int
    width: int = 4
    sequences: int | None = None
    channel_last: bool = False

    def shape_text(self) -> str:
        packed = f"/{self.sequences}seq" if self.sequences else ""
        layout = "/channel-last" if self.channel_last else ""
        return f"{self.batch}x{self.d}x{self.length}w{self.width}{packed}{layout}"

    def workload(self, device: torch.device) -> Workload:
        if self.channel_last:
            projection = torch.randn(self.batch, self.length, 2 * self.d, device=device, dtype=self.dtype)
            x = projection[..., : self.d].transpose(1, 2).requires_grad_()
        else:
            x = torch.randn(self.batch, self.d, self.length, device=device, dtype=self.dtype, requires_grad=True)
        weight = torch.randn(self.d, self.width, device=device, requires_grad=True)
        bias = torch.randn(self.d, device=device, requires_grad=True)
        offsets = None if self.sequences is None else packed_offsets(self.length, self.sequences).to(device)
        d_out = torch.randn_like(x)

        def forward() -> torch.Tensor:
            return linrec.causal_conv1d(x, weight, bias, "silu", cu_seqlens=offsets)

        def backward() -> Callable[[], object]:
            out = forward()
            return lambda: torch.autograd.grad(out, (x, weight, bias), d_out, retain_graph=True)

        return Workload(lambda: torch.add(x.detach(), d_out), {"api-fwd": lambda: forward, "api-bwd": backward})


@dataclass(frozen=True, kw_only=True)
class CausalConvStepCase(Case):
    """linrec.causal_conv1d_update (the conv's decode step) with a bias and SiLU, outside autograd: x (batch, d)
    and conv_state (batch, d, width - 1) in the dtype, weight and bias float32. torch.add of two state-sized
    tensors is the scale. A build without the step skips the row."""

    batch: int
    d: int
    width: int = 4

    @property
    def modes(self) -> tuple[str, ...]:
        return ("api-fwd",)

    def shape_text(self) -> str:
        return f"{self.batch}x{self.d}w{self.width}"

    def workload(self, device: torch.device) -> Workload:
        state = torch.randn(self.batch, self.d, self.width - 1, device=device, dtype=self.dtype)
        x = torch.randn(self.batch, self.d, device=device, dtype=self.dtype)
        weight, bias = torch.randn(self.d, self.width, device=device), torch.randn(self.d, device=device)

        def step() -> torch.Tensor:
            with torch.no_grad():
                return linrec.causal_conv1d_update(x, state, weight, bias, "silu")

        return Workload(lambda: torch.add(state, state), {"api-fwd": lambda: step})


def packed_offsets(length: int, sequences: int, empty: bool = False, seed: int = 0) -> torch.Tensor:
    """int32 cu_seqlens of ``sequences`` sequences of random unequal lengths that fill ``length``, the same
    on every run; with ``empty``, one of them is empty."""
    if not 1 + empty <= sequences <= length + empty:
        raise ValueError(f"cannot pack {sequences} sequences{' (one empty)' if empty else ''} into {length}")
    generator = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(length - 1, generator=generator)[: sequences - 1 - empty] + 1
    if empty:
        cuts = torch.cat([cuts, cuts[:1]])  # a repeated offset: an empty sequence
    return torch.cat([torch.zeros(1, dtype=cuts.dtype), cuts.sort().values, torch.tensor([length])]).to(torch.int32)


def _in(dtypes: Iterable[torch.dtype], quick: Iterable[torch.dtype] = (), **fields) -> list[ScanCase]:
    """One ScanCase per dtype, those of ``quick`` in the --quick subset."""
    return [ScanCase(dtype=dtype, quick=dtype in tuple(quick), **fields) for dtype in dtypes]


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def family_cases(rows: tuple[int, int], btc: tuple[int, ...]) -> list[Case]:
    """The features every device's grid runs on its time-last ``rows`` and (batch, time, channels) ``btc``."""
    cases: list[Case] = []
    for shape, dim in ((rows, -1), (btc, 1)):
        strided = dim == 1
        cases += [
            ScanCase(name="complex", shape=shape, dim=dim, dtype=torch.complex64, quick=strided),
            ScanCase(name="mixed-f32-coeffs", shape=shape, dim=dim, dtype=BF16, coeffs_dtype=F32, quick=strided),
            ScanCase(name="reverse-initial", shape=shape, dim=dim, reverse=True, initial=True, quick=not strided),
            ScanCase(name="log-coeffs", shape=shape, dim=dim, log_coeffs=True),
            ScanCase(name="nan", shape=shape, dim=dim, nonfinite="nan", quick=not strided),
            ScanCase(name="one-inf", shape=shape, dim=dim, nonfinite="inf"),
        ]
    cases += [
        ScanCase(name="coeffs-per-channel", shape=btc, dim=1, coeffs_shape=btc[-1:], quick=True),
        ScanCase(name="coeffs-scalar", shape=btc, dim=1, coeffs_shape=()),
    ]
    return cases


def selective_scan_cases(batch: int, d: int, length: int) -> list[Case]:
    """State sizes 1 to 100 (13: not a power of two; 100: a warp of lanes a channel on the GPU) with B and C
    time-varying, two with them constant."""
    return [
        *(SelectiveScanCase(name="selective-varying", batch=batch, d=d, n=n, length=length, quick=n == 16)
          for n in (1, 4, 13, 16, 64, 100)),
        SelectiveScanCase(name="selective-varying", batch=batch, d=d, n=16, length=length, dtype=BF16),
        *(SelectiveScanCase(name="selective-constant", batch=batch, d=d, n=n, length=length, constant_bc=True,
                            quick=n == 13) for n in (13, 16)),
    ]


def tiny_cases() -> list[Case]:
    """Calls where the host's work is all there is: lengths 0, 1 and 2, and a (1, 8) tensor."""
    return [ScanCase(name="tiny", shape=shape, per_call=True, quick=shape == (1, 8))
            for shape in ((0,), (1,), (2,), (1, 8))]


def cpu_cases() -> list[Case]:
    """The CPU grid: shapes of 2^16 to 2^22 elements, which a 2-core machine runs in about 4 minutes."""
    rows, btc = (64, 4096), (4, 4096, 256)
    return [
        *_in((F32, BF16, F16), quick=(F32,), name="time-last", shape=rows),
        *_in((F32,), name="short", shape=(256, 256)),
        *_in((F32, BF16), name="many-short", shape=(65536, 16)),
        *_in((F32, BF16), quick=(F32,), name="few-long", shape=(1, 1 << 22)),  # split across threads
        *_in((F32,), name="few-long", shape=(4, 1 << 20)),
        *_in((F32, BF16, F16), quick=(BF16,), name="strided-wide", shape=btc, dim=1),
        *_in((F32, BF16), name="strided-narrow", shape=(64, 4096, 8), dim=1),
        *_in((F32, BF16), quick=(F32,), name="packed-16", shape=(1, 4096, 256), dim=1, sequences=16),
        *_in((F32,), name="packed-64", shape=(1, 1 << 20), sequences=64),
        *family_cases(rows, btc),
        GaeCase(name="gae", shape=(2048, 1024), quick=True),
        *selective_scan_cases(2, 128, 1024),
        StateUpdateCase(name="selective-step", batch=16, d=1024, n=16, dtype=BF16, quick=True),
        CausalConvCase(name="causal-conv", batch=2, d=256, length=4096, dtype=BF16, quick=True),
        CausalConvCase(name="causal-conv", batch=1, d=256, length=8192, sequences=16),
        CausalConvStepCase(name="causal-conv-step", batch=64, d=2048),
        *tiny_cases(),
    ]


def gpu_cases() -> list[Case]:
    """The GPU grid: shapes of 2^24 to 2^27 elements (bandwidth-bound), fixed (not scaled by the SM count)
    so that baselines of one GPU model stay comparable."""
    rows, btc = (2048, 16384), (16, 2048, 1024)
    triton = dict(backend="triton")
    return [
        *_in((F32, BF16), quick=(F32,), name="time-last", shape=(13200, 16384)),
        *_in((F32, BF16, F16), name="time-last", shape=(13200, 1024)),
        *_in((F32, BF16), name="many-short", shape=(1 << 20, 16)),
        *_in((F32, BF16), quick=(F32,), name="few-long", shape=(1, 1 << 24)),  # fewer sequences than SMs
        *_in((F32, BF16), name="few-long", shape=(8, 1 << 21)),
        *_in((F32, BF16), name="few-long", shape=(64, 1 << 18)),
        *_in((F32, BF16, F16), quick=(F32, BF16), name="strided-wide", shape=btc, dim=1),
        *_in((F32, BF16), name="strided-long", shape=(2, 65536, 1024), dim=1),  # 2^27 elements: the largest
        *_in((F32, BF16), name="strided-narrow", shape=(1, 1 << 20, 64), dim=1),
        *_in((F32, BF16), name="strided-narrow", shape=(4096, 1024, 4), dim=1),
        *_in((F32, BF16), quick=(F32,), name="packed-16", shape=(1, 65536, 1024), dim=1, sequences=16),
        *_in((F32,), name="packed-4096", shape=(1, 65536, 1024), dim=1, sequences=4096, empty=True),
        *_in((F32,), name="packed-64", shape=(1, 1024, 65536), sequences=64),
        *family_cases(rows, btc),
        ScanCase(name="nan", shape=btc, dim=1, dtype=BF16, nonfinite="nan"),  # the bulk family's
        *_in((F32, BF16), quick=(F32,), name="triton-time-last", shape=rows, **triton),
        *_in((F32, BF16), name="triton-strided-wide", shape=btc, dim=1, **triton),
        *_in((F32,), name="triton-packed-16", shape=(1, 65536, 1024), dim=1, sequences=16, **triton),
        *_in((F32,), name="triton-few-long", shape=(1, 1 << 24), **triton),
        ScanCase(name="triton-nan", shape=rows, dtype=F32, nonfinite="nan", **triton),
        ScanCase(name="triton-nan", shape=btc, dim=1, dtype=F32, nonfinite="nan", **triton),
        GaeCase(name="gae", shape=(4096, 8192), quick=True),
        *selective_scan_cases(8, 1024, 2048),
        *(StateUpdateCase(name="selective-step", batch=batch, d=5120, n=16, dtype=BF16, quick=batch == 64)
          for batch in (1, 64)),
        StateUpdateCase(name="selective-step", batch=64, d=5120, n=64, dtype=BF16),
        CausalConvCase(name="causal-conv", batch=8, d=2048, length=2048, dtype=BF16, quick=True),
        CausalConvCase(name="causal-conv", batch=1, d=2048, length=65536, dtype=BF16, sequences=64),
        CausalConvCase(name="causal-conv", batch=8, d=2048, length=2048, dtype=BF16, channel_last=True),
        CausalConvCase(name="causal-conv", batch=64, d=1536, length=128, dtype=BF16),
        *(CausalConvStepCase(name="causal-conv-step", batch=batch, d=5120, dtype=BF16) for batch in (1, 64)),
        *tiny_cases(),
    ]


def grid(device: torch.device, quick: bool = False) -> list[Case]:
    """The device's grid, or its --quick subset."""
    cases = gpu_cases() if device.type == "cuda" else cpu_cases()
    return [case for case in cases if case.quick] if quick else cases


# Timing. bench.py has its own timers; these are repeated here so that this file runs against builds
# without linrec.tools.


class Timers(NamedTuple):
    """Milliseconds per call: of the device's work (RATIO rows), and on the host's wall clock (tiny calls)."""

    bandwidth: Timer
    per_call: Timer


def wall_clock_timer(synchronize: Callable[[], None] = lambda: None) -> Timer:
    """Median wall-clock milliseconds per call, after a warm-up call: samples of at least MIN_SAMPLE_S (calls
    shorter than that are timed in batches, the device synchronized at each sample's end), at least 3, and
    more within CPU_BUDGET_S."""

    def time_ms(fn: Callable[[], object]) -> float:
        fn()
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        batch = max(1, int(MIN_SAMPLE_S / max(time.perf_counter() - start, 1e-9)))
        samples = []
        deadline = time.perf_counter() + CPU_BUDGET_S
        while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 200):
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            synchronize()
            samples.append((time.perf_counter() - start) / batch)
        return statistics.median(samples) * 1e3

    return time_ms


def cuda_event_median(fn: Callable[[], object], warmup: int = 5, calls: int = 30) -> float:
    """Median milliseconds between CUDA events around single calls, where triton (do_bench) is missing."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_timers(device: torch.device) -> Timers:
    """The GPU's: triton.testing.do_bench's median (L2 flushed between calls), else CUDA events; the CPU's
    and the tiny calls': wall clock."""
    if device.type != "cuda":
        return Timers(wall_clock_timer(), wall_clock_timer())
    if importlib.util.find_spec("triton") is not None:
        from triton.testing import do_bench

        def bandwidth(fn: Callable[[], object]) -> float:
            return do_bench(fn, warmup=10, rep=40, return_mode="median")
    else:
        bandwidth = cuda_event_median
    # A process's first measurement was seen at half speed: one throwaway measurement first.
    bandwidth(lambda: torch.empty(1 << 20, device=device).fill_(1.0))
    return Timers(bandwidth, wall_clock_timer(lambda: torch.cuda.synchronize(device)))


#: The share of the cores, beyond those torch's threads leave free, that other processes may keep busy while
#: a case is measured (beyond it, the case is measured again, up to BUSY_RETRIES times after a pause of
#: BUSY_PAUSE_S), and during a run before it warns that its timings are unreliable.
BUSY_SHARE = 0.05
BUSY_RETRIES = 1
BUSY_PAUSE_S = 1.0


def busy_limit() -> float:
    """The share of the cores other processes may keep busy undisturbing: BUSY_SHARE, plus the cores torch's
    threads leave free (--threads 1 on 2 cores leaves one to them)."""
    cores = os.cpu_count() or 1
    return BUSY_SHARE + max(0, cores - torch.get_num_threads()) / cores


class CoreUse:
    """The share of the machine's cores that other processes kept busy since this was made: the machine's
    busy time (Linux's /proc/stat, steal by other virtual machines included) less this process's own CPU
    time and its workers', over the wall time and the cores. None where /proc/stat is missing. On a busy CPU every
    parallel op waits for a thread the scheduler runs up to a time slice late, which can take a 0.1 ms
    call to 10 ms: this tells a run measured on a quiet machine from one that was not."""

    def __init__(self) -> None:
        self.start = self.sample()

    @staticmethod
    def sample() -> tuple[float, float, float] | None:
        """(wall seconds, the machine's busy CPU seconds, the CPU seconds of this process and its finished
        children: the workers)."""
        stat = Path("/proc/stat")
        if not stat.exists():
            return None
        # user nice system idle iowait irq softirq steal, in clock ticks
        ticks = [int(value) for value in stat.read_text().split("\n", 1)[0].split()[1:9]]
        busy_s = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        return time.perf_counter(), busy_s, sum(os.times()[:4])

    def others(self) -> float | None:
        end = self.sample()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        (wall_0, busy_0, own_0), (wall_1, busy_1, own_1) = self.start, end
        return max(0.0, (busy_1 - busy_0 - (own_1 - own_0)) / ((wall_1 - wall_0) * (os.cpu_count() or 1)))

    def text(self) -> str:
        """What others() measured, in words; with a warning beyond busy_limit()."""
        share = self.others()
        if share is None:
            return "other processes' share of the cores unknown"
        text = f"other processes kept {share:.0%} of the cores busy"
        return text + " (warning: CPU timings and tiny calls are unreliable)" if share > busy_limit() else text


# Measuring.


@dataclass
class Row:
    """One (case, mode): its samples, one per repeat, or why it was skipped."""

    device: str
    name: str
    dtype: str
    mode: str
    shape: str
    metric: str
    samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def key(self) -> tuple[str, ...]:
        return self.device, self.name, self.dtype, self.mode, self.shape

    def summary(self) -> Summary | None:
        if not self.samples:
            return None
        return Summary(statistics.median(self.samples), min(self.samples), max(self.samples), len(self.samples))


class Summary(NamedTuple):
    """A row's median, the range of its repeats and their number."""

    median: float
    low: float
    high: float
    repeats: int


def describe(error: BaseException) -> str:
    """The first line of an exception, for a skipped row's note."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:100]


def free_memory(device: torch.device) -> None:
    """Frees the last case's tensors and graphs before the next one allocates its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_case(case: Case, modes: Sequence[str], device: torch.device, timers: Timers,
                 ) -> tuple[dict[str, float], dict[str, str]]:
    """One repeat of ``modes`` of a case on fresh operands: (mode -> sample, mode -> why it was skipped).
    A mode is skipped where preparing it or its first call raises, as where the installed build lacks an
    option or a backend."""
    samples: dict[str, float] = {}
    skipped: dict[str, str] = {}
    try:
        workload = case.workload(device)
    except Exception as error:  # noqa: BLE001 - any failure of one build's API skips the row, not the run
        free_memory(device)
        return samples, {mode: describe(error) for mode in modes}
    add_ms = None if workload.add is None else timers.bandwidth(workload.add)
    for mode in modes:
        try:
            call = workload.modes[mode]()
            call()
        except Exception as error:  # noqa: BLE001
            skipped[mode] = describe(error)
            free_memory(device)
            continue
        if add_ms is None:
            samples[mode] = timers.per_call(call) * 1e3
        else:
            samples[mode] = MODE_TENSORS[mode] / ADD_TENSORS * add_ms / timers.bandwidth(call)
        del call  # a backward's recorded graph
    del workload
    free_memory(device)
    return samples, skipped


def measure_undisturbed(case: Case, modes: Sequence[str], device: torch.device, timers: Timers,
                        ) -> tuple[dict[str, float], dict[str, str], int]:
    """measure_case, measured again after a pause (up to BUSY_RETRIES times) where other processes kept more
    than busy_limit() of the cores busy meanwhile; the least disturbed measurement, and how many times the
    case was measured again."""
    least_share, samples, skipped = math.inf, {}, {}
    for retries in range(BUSY_RETRIES + 1):
        if retries:
            time.sleep(BUSY_PAUSE_S)
        core_use = CoreUse()
        measured = measure_case(case, modes, device, timers)
        share = core_use.others()
        if share is None or share < least_share:
            least_share, (samples, skipped) = share or 0.0, measured
        if share is None or share <= busy_limit():
            break
    return samples, skipped, retries


def measure(cases: Sequence[Case], device: torch.device, timers: Timers, repeats: range, total: int,
            only: set[tuple[str, ...]] | None = None, log: Callable[[str], None] = print) -> list[Row]:
    """Rows of every case's modes (those of keys in ``only`` when given), measured in the ``repeats`` of
    ``total`` (indices from 0). Each repeat runs through the whole grid, the odd ones in reverse order, so
    that a slow phase of the machine reaches many rows once rather than one row in every repeat."""
    rows: dict[tuple[int, str], Row] = {}
    for index, case in enumerate(cases):
        for mode in case.modes:
            row = Row(device.type, case.name, str(case.dtype).removeprefix("torch."), mode, case.shape_text(),
                      case.metric)
            if only is None or row.key in only:
                rows[index, mode] = row
    # The objects alive before the run (torch's and its imports') are left out of the garbage collections
    # that free each case's tensors: a collection then takes microseconds instead of a tenth of a second.
    gc.freeze()
    try:
        for repeat in repeats:
            start_s, core_use, disturbed = time.perf_counter(), CoreUse(), 0
            order = list(enumerate(cases))
            for index, case in order if repeat % 2 == 0 else order[::-1]:
                modes = [mode for mode in case.modes if (index, mode) in rows and not rows[index, mode].note]
                if not modes:
                    continue
                samples, skipped, retries = measure_undisturbed(case, modes, device, timers)
                disturbed += retries > 0
                for mode, sample in samples.items():
                    rows[index, mode].samples.append(sample)
                for mode, note in skipped.items():
                    rows[index, mode].note = note
            log(f"repeat {repeat + 1}/{total}: {time.perf_counter() - start_s:.1f} s, {core_use.text()}"
                + (f"; {disturbed} cases measured again, disturbed by them" if disturbed else ""))
    finally:
        gc.unfreeze()
    return list(rows.values())


def grid_keys(device: torch.device, quick: bool) -> list[tuple[str, ...]]:
    """The keys (device, name, dtype, mode, shape) of the device's grid's rows."""
    return [(device.type, case.name, str(case.dtype).removeprefix("torch."), mode, case.shape_text())
            for case in grid(device, quick) for mode in case.modes]


def measure_in_processes(device: torch.device, quick: bool, threads: int | None, repeats: int,
                         only: set[tuple[str, ...]] | None = None) -> list[Row]:
    """Rows of the device's grid (those of keys in ``only`` when given), each repeat measured in a fresh Python
    process that runs this file as a worker, on the linrec this process imported. What differs between
    processes (where the allocator and the kernel place the operands in memory, which cache sets they
    share) moved a row of L2-sized operands by up to 50 % between runs on the CPU while repeats in one
    process agreed within 3 %: so the measured spread includes it, as a baseline's does."""
    rows: dict[tuple[str, ...], Row] = {}
    with tempfile.TemporaryDirectory(prefix="linrec-guard-") as folder:
        command = [sys.executable, str(Path(__file__).resolve()), "--device", device.type, "--repeats", str(repeats)]
        command += ["--quick"] * quick + ([] if threads is None else ["--threads", str(threads)])
        if only is not None:
            only_path = Path(folder) / "only.json"
            only_path.write_text(json.dumps(sorted(only)))
            command += ["--only", str(only_path)]
        package_parent = str(Path(linrec.__file__).resolve().parent.parent)
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
            path for path in (package_parent, os.environ.get("PYTHONPATH")) if path))
        for repeat in range(repeats):
            out = Path(folder) / f"repeat-{repeat}.json"
            sys.stdout.flush()
            subprocess.run([*command, "--worker", str(out), "--repeat-index", str(repeat)], env=environment,
                           check=True)
            result = json.loads(out.read_text())
            if result["linrec"] != linrec.__file__:
                raise RuntimeError(f"the worker imported linrec from {result['linrec']}, not {linrec.__file__}")
            for fields in result["rows"]:
                row = Row(**fields)
                if row.key in rows:
                    rows[row.key].samples += row.samples
                    rows[row.key].note = rows[row.key].note or row.note
                else:
                    rows[row.key] = row
    return list(rows.values())


def worker(args: argparse.Namespace) -> None:
    """One repeat of measure_in_processes: its rows written as JSON to args.worker."""
    device = torch.device(args.device)
    only = None if args.only is None else {tuple(key) for key in json.loads(args.only.read_text())}
    repeat = range(args.repeat_index, args.repeat_index + 1)
    rows = measure(grid(device, args.quick), device, device_timers(device), repeat, args.repeats, only,
                   functools.partial(print, flush=True))
    args.worker.write_text(json.dumps(dict(linrec=linrec.__file__, rows=[asdict(row) for row in rows])))


# Comparing with baselines.


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A guard CSV's comment lines (the machine and build it measured) and its rows."""
    with path.open(newline="") as handle:
        lines = handle.read().splitlines()
    comments = [line.removeprefix("#").strip() for line in lines if line.startswith("#")]
    return comments, list(csv.DictReader(line for line in lines if not line.startswith("#")))


def load_baseline(paths: Sequence[Path]) -> dict[tuple[str, ...], Summary]:
    """Each measured row's baseline over one or more guard CSVs: the median of their medians, the range
    spanning all of theirs, and their repeats summed."""
    found: dict[tuple[str, ...], list[Summary]] = {}
    for path in paths:
        for line in read_rows(path)[1]:
            if line["median"]:
                key = tuple(line[column] for column in ("device", "name", "dtype", "mode", "shape"))
                found.setdefault(key, []).append(Summary(float(line["median"]), float(line["low"]),
                                                         float(line["high"]), int(line["repeats"])))
    return {key: Summary(statistics.median(s.median for s in summaries), min(s.low for s in summaries),
                         max(s.high for s in summaries), sum(s.repeats for s in summaries))
            for key, summaries in found.items()}


def speed(summary: Summary, metric: str) -> Summary:
    """A summary as speed (higher is better): microseconds per call become calls per microsecond, their range's
    ends swapped."""
    if metric == RATIO:
        return summary
    return Summary(1 / summary.median, 1 / summary.high, 1 / summary.low, summary.repeats)


def verdict(row: Row, baseline: Summary | None, floor: float) -> str:
    """The row's flag: slower (faster) where its median is below (above) the baseline's by more than ``floor``
    and its range lies wholly below (above) the baseline's, i.e. the change of the medians exceeds the
    spread both measured on that side; skipped where the baseline measured a row this run skipped; else
    empty."""
    current = row.summary()
    if current is None or baseline is None:
        return "skipped" if baseline is not None else ""
    new, old = speed(current, row.metric), speed(baseline, row.metric)
    if new.median < old.median * (1 - floor) and new.high < old.low:
        return "slower"
    if new.median > old.median * (1 + floor) and new.low > old.high:
        return "faster"
    return ""


def row_floor(row: Row, floor: float | None) -> float:
    """The floor of a row's verdict: ``floor`` if given, else the device's (PER_CALL_FLOOR for tiny calls)."""
    if floor is not None:
        return floor
    return PER_CALL_FLOOR if row.metric == MICROSECONDS else FLOOR.get(row.device, FLOOR["cpu"])


# Output.


_CPUINFO = Path("/proc/cpuinfo")
# The x86 flags each instruction set of the CPU kernels needs (csrc/include/linrec/cpu/isa.h: best_cpu_isa).
_ISA_FLAGS = {"avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx2": ("avx2", "fma", "f16c")}


def _cpuinfo_field(name: str) -> str | None:
    """The first value of a /proc/cpuinfo field (Linux), or None."""
    try:
        lines = _CPUINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_instruction_set() -> str:
    """The vector instruction set linrec's CPU kernels run with here: the best of avx512, avx2 and the baseline
    (SSE2 on x86-64, NEON on aarch64) the CPU has, or the one LINREC_CPU_ISA names."""
    requested = os.environ.get("LINREC_CPU_ISA")
    if requested:
        return f"{requested} (LINREC_CPU_ISA)"
    if platform.machine() not in ("x86_64", "AMD64"):
        return "baseline (NEON)" if platform.machine() in ("aarch64", "arm64") else "baseline"
    flags = set((_cpuinfo_field("flags") or "").split())
    for isa, needed in _ISA_FLAGS.items():
        if flags.issuperset(needed):
            return isa
    return "baseline (SSE2)" if flags else "unknown (no /proc/cpuinfo)"


def cpu_description() -> str:
    """CPU model, cores, torch's threads and the CPU kernels' instruction set, in one line."""
    model = _cpuinfo_field("model name") or platform.processor() or platform.machine()
    return (f"cpu {model}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
            f"instruction set {cpu_instruction_set()}")


def gpu_description(device: torch.device) -> str:
    """The GPU's name, compute capability and memory, and torch's CUDA, in one line."""
    properties = torch.cuda.get_device_properties(device)
    return (f"gpu {properties.name}, compute capability {properties.major}.{properties.minor}, "
            f"{properties.total_memory / 2**30:.0f} GiB, {properties.multi_processor_count} SMs, CUDA {torch.version.cuda}")


def check_device(parser: argparse.ArgumentParser, name: str, why: str | None = None) -> str:
    """--device: cpu, or cuda where torch sees a GPU and linrec has CUDA kernels; else one line of error,
    starting with ``why`` (default: the option)."""
    if name not in ("cpu", "cuda"):
        parser.error(f"--device: expected cpu or cuda, got {name!r}")
    why = why or f"--device {name}"
    if name == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"{why}: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        if not linrec.HAS_CUDA_KERNELS:
            parser.error(f"{why}: this build of linrec has no CUDA kernels (python -m linrec info says why)")
    return name


def machine_info(device: torch.device) -> list[str]:
    """Lines that say which build ran where: written as the CSV's comments and printed above the table."""
    lines = [f"linrec {linrec.__version__} from {Path(linrec.__file__).parent}",
             f"torch {torch.__version__}, python {platform.python_version()}, {platform.platform()}"]
    lines.append(cpu_description())
    if device.type == "cuda":
        triton_spec = importlib.util.find_spec("triton")
        lines.append(f"{gpu_description(device)}, "
                     + ("triton installed" if triton_spec is not None else "triton not installed"))
    lines.append(f"measured {time.strftime('%Y-%m-%d %H:%M:%S')}, device {device.type}")
    return lines


def write_csv(rows: Sequence[Row], path: Path, comments: Sequence[str]) -> None:
    """The rows, median, low and high to 4 significant digits, under ``comments`` as '#' lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        handle.writelines(f"# {line}\n" for line in comments)
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            summary = row.summary()
            values = dict(median="", low="", high="", repeats=0) if summary is None else dict(
                median=f"{summary.median:.4g}", low=f"{summary.low:.4g}", high=f"{summary.high:.4g}",
                repeats=summary.repeats)
            writer.writerow(dict(device=row.device, name=row.name, dtype=row.dtype, mode=row.mode, shape=row.shape,
                                 metric=row.metric, note=row.note, **values))


def format_summary(summary: Summary | None) -> str:
    if summary is None:
        return "-"
    return f"{summary.median:.3g} [{summary.low:.3g}-{summary.high:.3g}]"


def print_table(rows: Sequence[Row], baseline: dict[tuple[str, ...], Summary] | None, verdicts: Sequence[str]) -> None:
    """One line per row: its median and range, and with a baseline the baseline's, the speed over it (above
    1: faster) and the verdict; a skipped row's note last."""
    header = ["name", "dtype", "shape", "mode", "metric", "median [low-high]"]
    if baseline is not None:
        header += ["baseline", "speed", "flag"]
    lines = [header + ["note"]]
    for row, flag in zip(rows, verdicts):
        current, old = row.summary(), None if baseline is None else baseline.get(row.key)
        line = [row.name, row.dtype, row.shape, row.mode, row.metric, format_summary(current)]
        if baseline is not None:
            ratio = "-"
            if current is not None and old is not None:
                ratio = f"{speed(current, row.metric).median / speed(old, row.metric).median:.2f}"
            line += [format_summary(old), ratio, flag]
        lines.append(line + [row.note])
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    for line in lines:
        print("  ".join(text.ljust(width) for text, width in zip(line, widths)) + "  " + line[-1])


def counts(rows: Sequence[Row], baseline: dict[tuple[str, ...], Summary] | None, verdicts: Sequence[str]) -> str:
    """The summary line: rows measured and skipped, and against a baseline how many are slower, faster and new."""
    measured = sum(row.summary() is not None for row in rows)
    text = f"{len(rows)} rows: {measured} measured, {len(rows) - measured} skipped"
    if baseline is not None:
        new = sum(row.summary() is not None and row.key not in baseline for row in rows)
        text += (f"; against the baseline: {verdicts.count('slower')} slower, {verdicts.count('faster')} faster, "
                 f"{verdicts.count('skipped')} skipped here but measured there, {new} not in it")
    return text


def main(argv: list[str] | None = None) -> int:
    """Runs the guard; returns the exit status (1 with --fail-on-regression and a slower row, else 0)."""
    parser = argparse.ArgumentParser(prog="python -m linrec bench --suite guard", description=__doc__.split("\n\n")[0])
    default_device = "cuda" if torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS else "cpu"
    parser.add_argument("--device", default=default_device, choices=("cpu", "cuda"),
                        help=f"default: {default_device}")
    parser.add_argument("--quick", action="store_true", help="a subset of the grid: one or two cases of each family")
    parser.add_argument("--out", type=Path, metavar="FILE.csv",
                        help="write the rows to this CSV (a baseline for --compare)")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="BASELINE.csv",
                        help="guard CSVs of the build to compare with; several are merged (median of medians)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help=f"default: {DEFAULT_REPEATS}")
    parser.add_argument("--threads", type=int,
                        help=f"torch's CPU threads (default: torch's, {torch.get_num_threads()} here); compare runs "
                             "of one thread count only")
    parser.add_argument("--floor", type=float,
                        help="the smallest change flagged, a fraction (default: 0.05 on the GPU, 0.10 on the CPU and "
                             "for tiny calls)")
    parser.add_argument("--fail-on-regression", action="store_true", help="exit with status 1 if a row is slower")
    parser.add_argument("--rows", metavar="REGEX",
                        help="only the rows whose 'name dtype mode shape' matches this regular expression (re.search)")
    # measure_in_processes' workers: where to write the rows, which repeat, which rows
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeat-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads: at least 1")
        torch.set_num_threads(args.threads)
    if args.worker is not None:
        worker(args)
        return 0

    device = torch.device(check_device(parser, args.device))
    info = machine_info(device)
    print("\n".join(info), flush=True)
    baseline = None
    if args.compare:
        for path in args.compare:
            print(f"baseline {path}: {(read_rows(path)[0] or ['no machine info'])[0]}")
        baseline = load_baseline(args.compare)
    start_s = time.perf_counter()
    core_use = CoreUse()
    selected = None
    if args.rows is not None:
        try:
            pattern = re.compile(args.rows)
        except re.error as error:
            parser.error(f"--rows: not a regular expression ({error}): {args.rows!r}")
        selected = {key for key in grid_keys(device, args.quick) if pattern.search(" ".join(key[1:]))}
        if not selected:
            parser.error(f"--rows: no row of the {device.type} grid matches {args.rows!r}")
    rows = measure_in_processes(device, args.quick, args.threads, args.repeats, selected)

    def verdicts_of(rows: Sequence[Row]) -> list[str]:
        if baseline is None:
            return [""] * len(rows)
        return [verdict(row, baseline.get(row.key), row_floor(row, args.floor)) for row in rows]

    verdicts = verdicts_of(rows)
    slower = {row.key for row, flag in zip(rows, verdicts) if flag == "slower"}
    if slower:
        print(f"measuring the {len(slower)} slower rows again, {REMEASURE_REPEATS} repeats")
        again = {row.key: row for row in measure_in_processes(device, args.quick, args.threads, REMEASURE_REPEATS,
                                                              slower)}
        rows = [again.get(row.key, row) for row in rows]
        verdicts = verdicts_of(rows)
    print()
    print_table(rows, baseline, verdicts)
    print(counts(rows, baseline, verdicts))
    info.append(f"{time.perf_counter() - start_s:.0f} s of measurement; {core_use.text()}")
    print(info[-1])
    if args.out is not None:
        write_csv(rows, args.out, info)
        print(f"wrote {args.out}")
    return 1 if args.fail_on_regression and "slower" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
