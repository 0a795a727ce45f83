"""The build record, the runtime checks that name what was built and what was found, and
`python -m linrec info`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import linrec
from linrec._core.runtime import build_info, cuda_problem, targets_for
from linrec.tools import info as info_tool

BUILT_FOR_13 = {"version": "0.1.0", "cuda": "13.0", "cuda_targets": ["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"]}
RECORD_FOR_13 = {**BUILT_FOR_13, "torch_target": "2.10", "built_with_torch": "2.13.0"}  # as setup.py writes it
RECORD_CPU_ONLY = {**RECORD_FOR_13, "cuda": None, "cuda_targets": []}
NO_RECORD = {**RECORD_CPU_ONLY, "torch_target": None, "built_with_torch": None}  # libraries built by CMake


def test_the_build_record_matches_the_package():
    info = build_info()
    assert info["built_with_torch"] is not None, "setup.py writes _build_info.json beside the libraries"
    assert info["version"].split("+")[0] == linrec.__version__
    assert info["torch_target"] == "2.10"
    assert (info["cuda"] is not None) == bool(info["cuda_targets"])


@pytest.mark.parametrize(
    ("capability", "runs"),
    [((8, 0), ["sm_80"]), ((8, 6), ["sm_80"]), ((9, 0), ["sm_90"]), ((12, 1), ["sm_120", "compute_120"]),
     ((13, 0), ["compute_120"]), ((7, 5), []), ((11, 0), [])],
)
def test_targets_for_a_gpu(capability, runs):
    """Machine code runs on its major with an equal or higher minor; PTX on any equal or newer GPU."""
    assert targets_for(BUILT_FOR_13["cuda_targets"], capability) == runs


def test_no_problem_where_the_kernels_run():
    assert cuda_problem(BUILT_FOR_13, 13000, "NVIDIA H100", (9, 0)) is None
    assert cuda_problem(BUILT_FOR_13, 13020, "NVIDIA RTX PRO 6000", (12, 0)) is None
    assert cuda_problem({**BUILT_FOR_13, "cuda": None, "cuda_targets": []}, None, "any", (9, 0)) is None


def test_a_driver_too_old_names_both_versions():
    problem = cuda_problem(BUILT_FOR_13, 12080, "NVIDIA H100", (9, 0))
    assert "built with CUDA 13.0" in problem and "sm_90" in problem
    assert "driver for CUDA 13.0 or newer" in problem and "supports CUDA 12.8" in problem
    assert "built with CUDA 12" in problem  # the wheel to install instead


def test_no_driver():
    assert "no NVIDIA driver" in cuda_problem(BUILT_FOR_13, None, "NVIDIA H100", (9, 0))


def test_a_gpu_the_build_has_no_code_for():
    problem = cuda_problem(BUILT_FOR_13, 13000, "Tesla T4", (7, 5))
    assert "Tesla T4" in problem and "compute capability 7.5" in problem
    assert "sm_80, sm_90, sm_100, sm_120, compute_120" in problem and "LINREC_CUDA_ARCHS" in problem


def test_an_older_torch_is_refused_at_import():
    """Before loading the libraries, which an older torch lacks the symbols for."""
    code = "import torch; torch.__version__ = '2.9.1+cpu'\nimport linrec"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: linrec ") and "needs torch >= 2.10" in message
    assert "stable ABI of torch 2.10" in message and "found torch 2.9.1+cpu" in message


def test_import_loads_neither_dynamo_nor_triton():
    """torch._dynamo and triton, slow to import, are imported where a feature needs them (torch.compile, the
    Triton backend): import linrec takes neither."""
    code = "import sys, linrec; print([name for name in ('torch._dynamo', 'triton') if name in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_info_prints_the_build_and_the_runtime():
    result = subprocess.run([sys.executable, "-m", "linrec", "info"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"linrec {build_info()['version']}"
    assert lines[1].startswith("  build: ") and "torch >= 2.10" in lines[1]
    assert f"torch {torch.__version__}" in result.stdout
    assert "NVIDIA driver:" in result.stdout
    loaded = next(line for line in lines if line.startswith("  CUDA kernels loaded: "))
    assert loaded.endswith(": True") or ", as " in loaded or ", but " in loaded  # a reason wherever they cannot run


@pytest.fixture
def torch_with(monkeypatch):
    """Makes info's view of torch: whether linrec loaded its CUDA kernels, and torch's CUDA release."""
    def set_torch(kernels_loaded: bool, cuda: str | None) -> None:
        monkeypatch.setattr(info_tool, "HAS_CUDA_KERNELS", kernels_loaded)
        monkeypatch.setattr(torch.version, "cuda", cuda)
    return set_torch


def test_info_says_a_cpu_only_torch_loads_no_cuda_kernels(torch_with):
    """The issue's case: a build with CUDA kernels, a CPU-only torch; whatever the build holds."""
    torch_with(kernels_loaded=False, cuda=None)
    for record in (RECORD_FOR_13, RECORD_CPU_ONLY):
        state = info_tool.cuda_kernels_state(record, None, [])
        assert state.startswith("False, as torch ") and "built without CUDA (torch.version.cuda is None)" in state


def test_info_says_the_build_has_no_cuda_kernels(torch_with):
    torch_with(kernels_loaded=False, cuda="13.0")
    assert "holds the CPU kernels only" in info_tool.cuda_kernels_state(RECORD_CPU_ONLY, 13000, [None])
    assert "no CUDA library (_C_cuda.so)" in info_tool.cuda_kernels_state(NO_RECORD, 13000, [None])


def test_info_says_why_loaded_kernels_cannot_run(torch_with):
    torch_with(kernels_loaded=True, cuda="13.0")
    assert "no NVIDIA driver" in info_tool.cuda_kernels_state(RECORD_FOR_13, None, [])
    no_gpu = info_tool.cuda_kernels_state(RECORD_FOR_13, 13000, [])
    assert "torch sees no GPU (torch.cuda.is_available() is False" in no_gpu
    assert "run on none of the GPUs" in info_tool.cuda_kernels_state(RECORD_FOR_13, 13000, ["a T4", "a V100"])
    assert info_tool.cuda_kernels_state(RECORD_FOR_13, 13000, ["a T4", None]) == "True"  # one GPU runs them


def test_info_reports_a_gpu_outside_the_build(monkeypatch, torch_with):
    torch_with(kernels_loaded=True, cuda="13.0")
    monkeypatch.setattr(info_tool, "build_info", lambda: RECORD_FOR_13)
    monkeypatch.setattr(info_tool, "cuda_driver_version", lambda: 13000)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 5))
    lines = info_tool.report()
    assert "  CUDA kernels loaded: True, but they run on none of the GPUs (each GPU's problem follows)" in lines
    assert "  GPU 0: Tesla T4, compute capability 7.5, runs none of the build targets" in lines
    assert lines[-1].startswith("    problem: ") and "LINREC_CUDA_ARCHS" in lines[-1]


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and linrec.HAS_CUDA_KERNELS), reason="needs a CUDA GPU and linrec's CUDA kernels")
def test_the_build_runs_on_this_gpu():
    """On the GPU machine: the wheel's kernels cover the GPU, and info says which target runs it."""
    assert linrec._core.backend.cuda_device_problem(torch.cuda.current_device()) is None
    result = subprocess.run([sys.executable, "-m", "linrec", "info"], capture_output=True, text=True, check=True)
    gpu_line = next(line for line in result.stdout.splitlines() if line.startswith("  GPU 0:"))
    assert "runs sm_" in gpu_line or "runs compute_" in gpu_line
    assert "  CUDA kernels loaded: True" in result.stdout.splitlines()
    assert "problem:" not in result.stdout
