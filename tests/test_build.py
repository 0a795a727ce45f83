"""setup.py's choice of CUDA architectures for a source build, tested without compiling: a fake
nvidia-smi stands for the machine's GPUs."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").exists(), reason="needs the repository checkout")


@pytest.fixture
def setup_py():
    """setup.py as a module: its functions without the setup() call, which runs only as __main__."""
    spec = importlib.util.spec_from_file_location("linrec_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Sets the GPUs nvidia-smi lists (lines of `name, compute_cap`), or its failure, or its absence
    (None): PATH holds only the fake, so a real nvidia-smi on a GPU machine does not answer."""
    monkeypatch.delenv("LINREC_CUDA_ARCHS", raising=False)
    monkeypatch.delenv("LINREC_NO_CUDA", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))

    def set_machine(gpus: list[str] | None, exit_status: int = 0) -> None:
        if gpus is not None:
            fake = tmp_path / "nvidia-smi"
            # printf is a shell builtin: the fake needs nothing on PATH.
            lines = "".join(f"printf '%s\\n' {shlex.quote(line)}\n" for line in gpus)
            fake.write_text(f"#!/bin/sh\n{lines}exit {exit_status}\n")
            fake.chmod(0o755)
    return set_machine


def test_a_source_build_compiles_for_the_machines_gpus(setup_py, machine):
    machine(["NVIDIA H100 80GB HBM3, 9.0", "NVIDIA H100 80GB HBM3, 9.0", "NVIDIA GeForce RTX 5090, 12.0",
             "NVIDIA A100-SXM4-40GB, 8.0"])
    archs, reason = setup_py.choose_cuda_archs()
    assert archs == "8.0;9.0;12.0"  # each once, by capability (12.0 after 9.0)
    assert "GPUs nvidia-smi lists on this machine" in reason
    assert "2 x NVIDIA H100 80GB HBM3 (9.0), NVIDIA GeForce RTX 5090 (12.0)" in reason and "LINREC_CUDA_ARCHS" in reason


def test_linrec_cuda_archs_overrides_the_gpus(setup_py, machine, monkeypatch):
    machine(["NVIDIA H100 80GB HBM3, 9.0"])
    monkeypatch.setenv("LINREC_CUDA_ARCHS", "8.0;10.0;12.0+PTX")
    assert setup_py.choose_cuda_archs() == ("8.0;10.0;12.0+PTX", "as LINREC_CUDA_ARCHS asks")


@pytest.mark.parametrize(
    ("gpus", "exit_status", "why"),
    [(None, 0, "nvidia-smi is not on PATH"), ([], 0, "nvidia-smi lists no GPU"),
     (["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."], 9,
      "nvidia-smi failed (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)")],
)
def test_without_a_gpu_the_build_says_why(setup_py, machine, gpus, exit_status, why):
    machine(gpus, exit_status)
    assert setup_py.choose_cuda_archs() == (None, f"{why} and LINREC_CUDA_ARCHS is not set")


def test_the_build_log_names_the_choice(setup_py, machine, monkeypatch, capsys):
    """With a toolkit: the CUDA library for the GPUs' archs, and a log line that says which and why;
    without a GPU, the CPU library alone, and why."""
    monkeypatch.setattr(setup_py, "find_cuda_home", lambda: Path("/usr/local/cuda"))
    machine(["NVIDIA H100 80GB HBM3, 9.0"])
    libraries = setup_py.native_libraries()
    assert [(library.name, library.cuda_archs) for library in libraries] == [("linrec._C", None),
                                                                             ("linrec._C_cuda", "9.0")]
    assert "linrec build: CUDA architectures 9.0: those of the GPUs nvidia-smi lists" in capsys.readouterr().err

    Path(setup_py.shutil.which("nvidia-smi")).unlink()
    assert [library.name for library in setup_py.native_libraries()] == ["linrec._C"]
    log = capsys.readouterr().err
    assert "building the CPU kernels only: nvidia-smi is not on PATH and LINREC_CUDA_ARCHS is not set" in log
