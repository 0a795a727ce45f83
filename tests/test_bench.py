"""python -m linrec bench's tables: their code path on small shapes with a stub timer (timings are never
asserted), the GPU cases' shapes checked without a GPU; the tools' argument errors, noise report and machine
description."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest
import torch

import linrec
from linrec import __main__ as linrec_main
from linrec.tools import bench, guard


def test_layout_table_runs_through_the_public_api(device, monkeypatch, tmp_path, capsys):
    def time_once(fn):
        fn()
        return 1.0

    monkeypatch.setattr(bench, "timer", lambda device: time_once)
    cases = [
        bench.LayoutCase("btc", (2, 64, 8), 1),
        bench.LayoutCase("packed-4", (1, 64, 8), 1, sequences=4, empty=True),
        bench.LayoutCase("packed-initial", (1, 8, 64), -1, sequences=3, initial=True),
        bench.LayoutCase("coeffs-scalar", (2, 64, 8), 1, ()),
        bench.LayoutCase("coeffs-shared", (2, 64, 8), 1, (2, 64, 1)),
        bench.LayoutCase("complex", (2, 32, 4), 1, dtype=torch.complex64),
    ]
    # complex128 is not a real dtype: the real cases skip it, the complex case runs once in complex64
    dtypes = [torch.float32, torch.bfloat16, torch.complex128]
    rows = bench.measure_layouts(torch.device(device), dtypes, lambda runs: runs, cases)
    real = [case.name for case in cases if case.dtype is None]
    # The Triton kernels run beside the compiled ones on a GPU with triton installed; they take real dtypes only.
    impls = list(bench.kernel_backends(torch.device(device)))
    assert [(row["dtype"], row["case"], row["impl"]) for row in rows] == (
        [(dtype, name, impl) for dtype in ("float32", "bfloat16") for name in real for impl in impls]
        + [("complex64", "complex", "linrec")])
    for row in rows:
        packed = row["case"].startswith("packed")
        assert (row["vs_unpacked_fwd"] is not None) == packed and (row["vs_unpacked_bwd"] is not None) == packed
        assert (row["peak"] is None) == (device == "cpu")
        if row["peak"] is not None:
            assert row["peak"] > 0
        assert math.isclose(row["fwd_ratio"], 1.0) and math.isclose(row["bwd_ratio"], 5 / 3)
    coeffs_of = {row["case"]: row["coeffs"] for row in rows}
    assert coeffs_of["coeffs-scalar"] == "scalar" and coeffs_of["coeffs-shared"] == "2x64x1"

    bench.print_table(rows, bench.LAYOUT_COLUMNS, [])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 + len(rows) and "fwd vs unpacked" in printed[0]
    bench.write_csv(rows, tmp_path / "layouts.csv")
    with (tmp_path / "layouts.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)


def test_packed_offsets():
    offsets = bench.packed_offsets(65536, 4096, empty=True)
    lengths = offsets.diff()
    assert offsets.dtype == torch.int32 and offsets[0] == 0 and offsets[-1] == 65536 and len(offsets) == 4097
    assert (lengths == 0).sum() == 1 and (lengths >= 0).all() and len(set(lengths.tolist())) > 10
    assert torch.equal(offsets, bench.packed_offsets(65536, 4096, empty=True))  # the same on every run
    assert bench.packed_offsets(100, 1).tolist() == [0, 100]


def test_gpu_layout_cases_are_valid_calls(monkeypatch):
    """Every GPU case is a valid call (checked on the meta device; packed ones by their offsets) of at
    most 2^27 elements, without a GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    cases = bench.layout_cases(torch.device("cuda"))
    assert len({(case.name, case.shape) for case in cases}) == len(cases)
    for case in cases:
        assert math.prod(case.shape) <= 1 << 27
        dtype = case.dtype or torch.float32
        inputs = torch.empty(case.shape, device="meta", dtype=dtype)
        coeffs = torch.empty(case.shape if case.coeffs is None else case.coeffs, device="meta", dtype=dtype)
        if case.sequences is None:
            assert linrec.linrec(inputs, coeffs, case.dim).shape == case.shape
        else:
            offsets = bench.packed_offsets(case.shape[case.dim], case.sequences, case.empty)
            assert case.shape[0] == 1 and len(offsets) == case.sequences + 1


def test_selective_scan_table(device, monkeypatch, tmp_path, capsys):
    """Every backend runs on a small Mamba-like case; the loop is skipped past its length limit; on the GPU
    a mamba_ssm row runs where mamba_ssm is installed and says so where it is not."""
    def time_once(fn):  # the timed functions take the backend as a default argument: linrec's are 2 ms, the others 4
        fn()
        return 2.0 if fn.__defaults__ == ("auto",) else 4.0

    monkeypatch.setattr(bench, "timer", lambda device: time_once)
    monkeypatch.setattr(bench, "MAX_SELECTIVE_LOOP_LENGTH", 16)
    cases = [bench.SelectiveScanCase(2, 4, 3, 16), bench.SelectiveScanCase(1, 4, 2, 17)]
    rows = bench.measure_selective_scan(torch.device(device), [torch.float32, torch.bfloat16, torch.complex64],
                                        lambda runs: runs, cases)
    impls = ("linrec", "composed", "hop", "loop") + (("mamba_ssm",) if device == "cuda" else ())
    assert [(row["dtype"], row["shape"], row["impl"]) for row in rows] == [
        (dtype, shape, impl) for dtype in ("float32", "bfloat16") for shape in ("2x4x3x16", "1x4x2x17")
        for impl in impls]
    mamba_installed = bench.mamba_selective_scan() is not None
    for row in rows:
        skipped = ((row["impl"] == "loop" and row["shape"] == "1x4x2x17")
                   or (row["impl"] == "mamba_ssm" and not mamba_installed))
        assert (row["ms"] is None) == skipped and (row["note"] is not None) == skipped
        if not skipped:
            assert row["vs_linrec"] == (1.0 if row["impl"] == "linrec" else 2.0)
            assert (row["peak_mib"] is None) == (device == "cpu")
            if row["peak_mib"] is not None:
                assert row["peak_mib"] > 0
    loop_row = rows.index(next(row for row in rows if row["impl"] == "loop" and row["shape"] == "1x4x2x17"))
    assert rows[loop_row]["note"] == "skipped: length > 16"

    bench.print_table(rows, bench.SELECTIVE_SCAN_COLUMNS, [])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 + len(rows) and "fwd+bwd ms" in printed[0] and "skipped" in printed[2 + loop_row]
    bench.write_csv(rows, tmp_path / "selective.csv")
    with (tmp_path / "selective.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)


def test_gpu_selective_scan_cases_are_valid_calls():
    """The GPU cases are valid calls (on the meta device), Mamba-like, and the loop runs on one of them."""
    cases = bench.selective_scan_cases(torch.device("cuda"))
    assert any(case.length <= bench.MAX_SELECTIVE_LOOP_LENGTH for case in cases)
    for batch, d, n, length in cases:
        assert batch * d * n * length <= bench.MAX_SELECTIVE_HOP_ELEMENTS
        u = torch.empty(batch, d, length, device="meta")
        B = torch.empty(batch, n, length, device="meta")
        out, state = linrec.selective_scan(u, u, torch.empty(d, n, device="meta"), B, B, return_last_state=True)
        assert out.shape == (batch, d, length) and state.shape == (batch, d, n)


@pytest.mark.parametrize("tool, arguments, message", [
    ("bench", ["--dtypes", "float8"], "--dtypes: expected comma-separated names of float32, float64"),
    ("bench", ["--dtypes", "int32"], "got 'int32'"),
    ("bench", ["--device", "tpu"], "--device: expected cpu or cuda, got 'tpu'"),
    ("bench", ["--tables", "speed"], "--tables: expected names of"),
    ("tune", ["--dtypes", "float8"], "--dtypes: expected"),
])
def test_argument_errors_are_one_line(tool, arguments, message, capsys):
    """A bad argument ends the tool with argparse's usage and one line of error, exit status 2, no traceback
    (the tool run in this process: any other exception fails the test)."""
    assert run_tool([tool, *arguments], capsys) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_cuda_device_without_a_gpu_is_one_line(capsys):
    if torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS:
        pytest.skip("this machine runs the CUDA kernels")
    for command in (["bench", "--device", "cuda"], ["bench", "--suite", "guard", "--device", "cuda"], ["tune"]):
        assert run_tool(command, capsys) == 2, command
        error = capsys.readouterr().err
        assert ("torch sees no CUDA GPU" in error) != ("has no CUDA kernels" in error), command


def run_tool(argv: list[str], capsys) -> int | None:
    """``python -m linrec *argv`` in this process: its exit status (None where it returned)."""
    capsys.readouterr()
    try:
        linrec_main.main(argv)
    except SystemExit as exit_:
        return exit_.code
    return None


def test_noise_report(monkeypatch):
    """Quiet measurements and cores say their noise; a wide spread or busy cores give a warning."""
    core_use = SimpleNamespace(others=lambda: 0.02)
    monkeypatch.setattr(bench, "timing_spread", bench.TimingSpread())
    for times in ([1.0, 1.01, 0.99, 1.0, 1.02], [2.0, 2.02, 1.98]):
        bench.timing_spread.add(times)
    assert bench.noise_report(torch.device("cpu"), core_use).startswith("noise: the median measurement's spread was 2%")
    assert "other processes kept 2% of the cores busy" in bench.noise_report(torch.device("cpu"), core_use)
    busy = SimpleNamespace(others=lambda: 0.9)
    assert bench.noise_report(torch.device("cpu"), busy).startswith("warning: the machine was busy or noisy")
    bench.timing_spread.add([1.0, 2.0, 1.5, 0.5])  # spreads of 100% and 160%: their median with the two of 2%
    bench.timing_spread.add([1.0, 3.0, 1.5, 0.5])  # is 51%
    assert bench.noise_report(torch.device("cuda"), core_use).startswith("warning:")


def test_machine_description_names_the_cpu_and_its_instruction_set(monkeypatch):
    description = guard.cpu_description()
    assert description.startswith("cpu ") and f"{torch.get_num_threads()} threads" in description
    assert "instruction set " in description
    monkeypatch.setenv("LINREC_CPU_ISA", "baseline")
    assert guard.cpu_instruction_set() == "baseline (LINREC_CPU_ISA)"
