"""The benchmark guard (python -m linrec bench --suite guard): its measurement on a small CPU grid, the CSV,
the comparison with baselines and the re-measurement of slower rows; the grids checked on the meta device.
Timings are never asserted."""

from __future__ import annotations

import ast
import csv
import math
import sys

import pytest
import torch

from linrec.tools import bench, guard

CPU = torch.device("cpu")

#: Every kind of row on tiny operands, and one whose API no build has (an unknown backend).
SMALL_GRID = [
    guard.ScanCase(name="time-last", shape=(4, 64)),
    guard.ScanCase(name="strided", shape=(2, 32, 4), dim=1, dtype=torch.bfloat16, coeffs_dtype=torch.float32),
    guard.ScanCase(name="packed", shape=(1, 64, 4), dim=1, sequences=3, empty=True),
    guard.ScanCase(name="options", shape=(2, 32, 4), dim=1, reverse=True, initial=True, log_coeffs=True),
    guard.ScanCase(name="one-inf", shape=(2, 32, 4), dim=1, coeffs_shape=(), nonfinite="inf"),
    guard.ScanCase(name="complex", shape=(4, 16), dtype=torch.complex64, coeffs_shape=(16,)),
    guard.ScanCase(name="tiny", shape=(1, 8), per_call=True),
    guard.ScanCase(name="no-such-backend", shape=(4, 64), backend="no-such-backend"),
    guard.GaeCase(name="gae", shape=(16, 4)),
    guard.SelectiveScanCase(name="selective-varying", batch=1, d=4, n=3, length=16),
    guard.SelectiveScanCase(name="selective-constant", batch=1, d=4, n=3, length=16, constant_bc=True),
]


@pytest.fixture
def fast_measurement(monkeypatch):
    """The CPU timer takes its minimum of samples (3), and a case disturbed by other processes (the test
    suite's other worker) is not measured again."""
    monkeypatch.setattr(guard, "CPU_BUDGET_S", 0.0)
    monkeypatch.setattr(guard, "BUSY_RETRIES", 0)


def test_small_grid_measures_every_row_and_skips_a_missing_api(fast_measurement, tmp_path):
    rows = guard.measure(SMALL_GRID, CPU, guard.device_timers(CPU), range(2), 2, log=lambda text: None)
    assert [(row.name, row.mode) for row in rows] == [(case.name, mode) for case in SMALL_GRID for mode in case.modes]
    assert {row.mode for row in rows if row.name == "time-last"} == {"ops-fwd", "ops-bwd", "api-fwd", "api-bwd"}
    for row in rows:
        if row.name == "no-such-backend":
            assert row.mode.startswith("api") and row.note.startswith("ValueError") and not row.samples
            continue
        assert row.note == "" and len(row.samples) == 2 and all(sample > 0 for sample in row.samples)
        assert row.metric == (guard.MICROSECONDS if row.name == "tiny" else guard.RATIO)
    shapes = {row.name: row.shape for row in rows}
    assert shapes["time-last"] == "4x64" and shapes["strided"] == "2x32x4:1" and shapes["gae"] == "16x4:0"
    assert shapes["selective-varying"] == "1x4x3x16"

    path = tmp_path / "guard.csv"
    guard.write_csv(rows, path, ["linrec 0.0 from somewhere", "cpu test"])
    comments, lines = guard.read_rows(path)
    assert comments == ["linrec 0.0 from somewhere", "cpu test"]
    with path.open() as handle:
        header = next(line for line in handle if not line.startswith("#"))
    assert next(csv.reader([header])) == list(guard.CSV_COLUMNS)
    assert len(lines) == len(rows)
    skipped = [line for line in lines if line["name"] == "no-such-backend"]
    assert all(line["median"] == "" and line["repeats"] == "0" and line["note"] for line in skipped)
    baseline = guard.load_baseline([path])
    assert len(baseline) == len(rows) - len(skipped)
    for row in rows:
        if row.samples:
            median, low, high, repeats = baseline[row.key]
            assert low <= median <= high and repeats == 2
            assert math.isclose(median, row.summary().median, rel_tol=1e-3)


@pytest.mark.parametrize("shares, kept, retries", [([0.0], 1, 0), ([0.5, 0.3, 0.01], 3, 2), ([0.5, 0.2, 0.4], 2, 2)])
def test_a_case_disturbed_by_other_processes_is_measured_again(monkeypatch, shares, kept, retries):
    """Measured again while other processes keep more of the cores busy than busy_limit() allows (2 threads on
    2 cores: 5 %), at most BUSY_RETRIES times: the least disturbed measurement is kept."""
    measured_shares = iter(shares)
    monkeypatch.setattr(guard.CoreUse, "others", lambda self: next(measured_shares))
    monkeypatch.setattr(guard, "BUSY_PAUSE_S", 0.0)
    monkeypatch.setattr(guard, "BUSY_RETRIES", 2)
    monkeypatch.setattr(guard, "busy_limit", lambda: 0.05)
    attempts = []

    def measure_case(case, modes, device, timers):
        attempts.append(case)
        return {"api-fwd": float(len(attempts))}, {}

    monkeypatch.setattr(guard, "measure_case", measure_case)
    case = SMALL_GRID[0]
    assert guard.measure_undisturbed(case, ["api-fwd"], CPU, None) == ({"api-fwd": float(kept)}, {}, retries)
    assert len(attempts) == len(shares)


def summary(median: float, spread: float, repeats: int = 3) -> guard.Summary:
    return guard.Summary(median, median * (1 - spread), median * (1 + spread), repeats)


def row_of(samples: list[float], metric: str = guard.RATIO) -> guard.Row:
    return guard.Row("cpu", "time-last", "float32", "ops-fwd", "64x4096", metric, samples)


def test_verdict_flags_a_change_beyond_the_floor_and_the_spread_only():
    baseline = summary(1.0, 0.03)  # 0.97 to 1.03
    assert guard.verdict(row_of([0.80, 0.81, 0.82]), baseline, 0.10) == "slower"
    assert guard.verdict(row_of([0.93, 0.99, 1.01]), baseline, 0.10) == ""  # within noise
    assert guard.verdict(row_of([0.50, 0.80, 0.98]), baseline, 0.10) == ""  # 20 % lower, but the ranges overlap
    assert guard.verdict(row_of([0.90, 0.91, 0.92]), baseline, 0.10) == ""  # below its range, within the floor
    assert guard.verdict(row_of([0.90, 0.91, 0.92]), baseline, 0.05) == "slower"
    assert guard.verdict(row_of([1.30, 1.31, 1.32]), baseline, 0.10) == "faster"
    assert guard.verdict(row_of([]), baseline, 0.10) == "skipped"
    assert guard.verdict(row_of([0.5]), None, 0.10) == ""  # not in the baseline
    # microseconds: lower is better
    microseconds = summary(10.0, 0.02)
    assert guard.verdict(row_of([12.0, 12.5, 13.0], guard.MICROSECONDS), microseconds, 0.10) == "slower"
    assert guard.verdict(row_of([7.0, 7.5, 8.0], guard.MICROSECONDS), microseconds, 0.10) == "faster"
    assert guard.verdict(row_of([10.3, 10.5, 10.7], guard.MICROSECONDS), microseconds, 0.10) == ""


def test_several_baselines_merge(tmp_path):
    paths = []
    for index, samples in enumerate(([0.9, 1.0, 1.1], [1.0, 1.2, 1.3], [0.8, 1.4, 1.5])):
        paths.append(tmp_path / f"baseline-{index}.csv")
        guard.write_csv([row_of(samples)], paths[-1], [])
    assert guard.load_baseline(paths)[row_of([]).key] == guard.Summary(1.2, 0.8, 1.5, 9)


def test_main_compares_remeasures_slower_rows_and_fails_only_when_asked(fast_measurement, monkeypatch, tmp_path,
                                                                        capsys):
    grid = [guard.ScanCase(name="time-last", shape=(4, 64)), guard.ScanCase(name="tiny", shape=(1, 8), per_call=True)]
    monkeypatch.setattr(guard, "cpu_cases", lambda: grid)

    def measure_here(device, quick, threads, repeats, only=None):  # in this process, which has the grid above
        return guard.measure(guard.grid(device, quick), device, guard.device_timers(device), range(repeats), repeats,
                             only)

    monkeypatch.setattr(guard, "measure_in_processes", measure_here)
    first = tmp_path / "first.csv"
    assert guard.main(["--device", "cpu", "--repeats", "1", "--out", str(first)]) == 0
    comments, lines = guard.read_rows(first)
    assert comments[0].startswith("linrec ") and "of measurement; other processes" in comments[-1]
    assert len(lines) == 8

    # A baseline of wide ranges (a tenth to 10 times each median: every row within noise) where time-last's
    # ops-fwd was 100 times faster.
    for line in lines:
        median = float(line["median"]) * (100 if (line["name"], line["mode"]) == ("time-last", "ops-fwd") else 1)
        line.update(median=f"{median:.6g}", low=f"{median / 10:.6g}", high=f"{median * 10:.6g}")
    baseline = tmp_path / "baseline.csv"
    with baseline.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=guard.CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(lines)
    capsys.readouterr()
    second = tmp_path / "second.csv"
    arguments = ["--device", "cpu", "--repeats", "1", "--compare", str(baseline), "--out", str(second)]
    assert guard.main([*arguments, "--fail-on-regression"]) == 1
    printed = capsys.readouterr().out
    assert f"measuring the 1 slower rows again, {guard.REMEASURE_REPEATS} repeats" in printed
    assert "1 slower, 0 faster" in printed
    repeats = {line["mode"]: line["repeats"] for line in guard.read_rows(second)[1] if line["name"] == "time-last"}
    assert repeats == {"ops-fwd": str(guard.REMEASURE_REPEATS), "ops-bwd": "1", "api-fwd": "1", "api-bwd": "1"}
    assert guard.main(arguments) == 0


def test_rows_selects_by_regular_expression(fast_measurement, monkeypatch, tmp_path, capsys):
    grid = [guard.ScanCase(name="time-last", shape=(4, 64)), guard.ScanCase(name="tiny", shape=(1, 8), per_call=True)]
    monkeypatch.setattr(guard, "cpu_cases", lambda: grid)
    asked = []

    def measure_here(device, quick, threads, repeats, only=None):
        asked.append(only)
        return guard.measure(guard.grid(device, quick), device, guard.device_timers(device), range(repeats), repeats,
                             only)

    monkeypatch.setattr(guard, "measure_in_processes", measure_here)
    out = tmp_path / "rows.csv"
    assert guard.main(["--device", "cpu", "--repeats", "1", "--rows", "time-last .* ops-", "--out", str(out)]) == 0
    assert asked == [{("cpu", "time-last", "float32", mode, "4x64") for mode in ("ops-fwd", "ops-bwd")}]
    assert [(line["name"], line["mode"]) for line in guard.read_rows(out)[1]] == [("time-last", "ops-fwd"),
                                                                                  ("time-last", "ops-bwd")]
    for pattern, message in (("nothing-matches", "no row of the cpu grid matches"), ("(", "not a regular expression")):
        with pytest.raises(SystemExit):
            guard.main(["--device", "cpu", "--rows", pattern])
        assert f"--rows: {message}" in capsys.readouterr().err


def test_repeats_run_in_worker_processes(capfd):
    """A worker process measures one row of the quick grid on this process's linrec; each repeat is a worker."""
    key = ("cpu", "tiny", "float32", "ops-fwd", "1x8")
    rows = guard.measure_in_processes(CPU, quick=True, threads=1, repeats=2, only={key})
    assert [row.key for row in rows] == [key] and len(rows[0].samples) == 2 and rows[0].note == ""
    printed = capfd.readouterr().out  # the workers' output, on this process's file descriptor
    assert "repeat 1/2" in printed and "repeat 2/2" in printed


def test_bench_runs_the_guard_with_its_options(monkeypatch):
    calls = []
    monkeypatch.setattr(guard, "main", lambda argv: calls.append(argv) or len(calls) - 1)
    bench.main(["--suite", "guard", "--quick", "--out", "guard.csv"])
    assert calls == [["--quick", "--out", "guard.csv"]]
    with pytest.raises(SystemExit) as exit_info:  # a regression's status reaches the shell
        bench.main(["--compare", "old.csv", "--suite", "guard", "--fail-on-regression"])
    assert exit_info.value.code == 1 and calls[1] == ["--compare", "old.csv", "--fail-on-regression"]


def test_guard_imports_only_the_public_api():
    """Older builds lack linrec's private modules: the guard imports torch, linrec, linrec.rl, triton and
    the standard library only, and names nothing private of linrec."""
    tree = ast.parse(open(guard.__file__).read())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            modules.add(node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "linrec":
            assert not node.attr.startswith("_") or node.attr.startswith("__"), f"linrec.{node.attr}"
    third_party = {name for name in modules if name.split(".")[0] not in sys.stdlib_module_names}
    assert third_party == {"torch", "linrec", "linrec.rl", "triton.testing"}


@pytest.mark.parametrize("grid", [guard.cpu_cases, guard.gpu_cases])
def test_grids_are_valid_calls(grid):
    """Every row of both grids prepares and calls its operands on the meta device; rows are unique, the GPU's
    at most 2^28 elements, and the quick subset holds every kind of row."""
    cases = grid()
    keys = [(case.name, case.dtype, case.shape_text()) for case in cases]
    assert len(set(keys)) == len(keys)
    meta = torch.device("meta")
    for case in cases:
        workload = case.workload(meta)
        assert set(workload.modes) == set(case.modes) and (workload.add is None) == (case.metric == guard.MICROSECONDS)
        for prepare in workload.modes.values():
            prepare()()
        if isinstance(case, guard.ScanCase):
            assert math.prod(case.shape) <= 1 << 28
    quick = [case for case in cases if case.quick]
    assert {type(case) for case in quick} == {guard.ScanCase, guard.GaeCase, guard.SelectiveScanCase,
                                              guard.StateUpdateCase, guard.CausalConvCase}
    assert {case.name for case in quick} >= {"time-last", "few-long", "packed-16", "nan", "tiny"}
