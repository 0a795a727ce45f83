"""linrec.bench's model-layout table: its code path on small shapes with a stub timer (timings are
never asserted), and the GPU cases' shapes checked without a GPU."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import torch

import linrec
from linrec import bench


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
    assert [(row["dtype"], row["case"]) for row in rows] == (
        [("float32", name) for name in real] + [("bfloat16", name) for name in real] + [("complex64", "complex")])
    for row in rows:
        packed = row["case"].startswith("packed")
        assert (row["vs_unpacked_fwd"] is not None) == packed and (row["vs_unpacked_bwd"] is not None) == packed
        assert (row["peak"] is None) == (device == "cpu")
        if row["peak"] is not None:
            assert row["peak"] > 0
        assert math.isclose(row["fwd_ratio"], 1.0) and math.isclose(row["bwd_ratio"], 5 / 3)
    assert rows[3]["coeffs"] == "scalar" and rows[4]["coeffs"] == "2x64x1"

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
