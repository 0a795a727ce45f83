"""The release machinery: the GitHub workflows pass a validator, cibuildwheel reads its
configuration as meant, and .ci/check_wheel.py accepts a good wheel and names what is wrong with a
bad one. Needs the repository checkout and the `test` extra (check-jsonschema, cibuildwheel)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))

pytestmark = pytest.mark.skipif(not (ROOT / ".ci" / "check_wheel.py").exists(), reason="needs the repository checkout")


def validate_workflows(paths: list[Path]) -> subprocess.CompletedProcess:
    validator = shutil.which("check-jsonschema")
    if validator is None:
        pytest.skip("check-jsonschema is not installed (pip install linrec[test])")
    return subprocess.run([validator, "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, check=False)


def test_workflows_validate():
    assert {path.name for path in WORKFLOWS} == {"ci.yml", "wheels.yml"}
    result = validate_workflows(WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_rejects_a_broken_workflow(tmp_path):
    """The check can fail: a job without runs-on and a step with an unknown key."""
    broken = tmp_path / "broken.yml"
    broken.write_text("name: broken\non: push\njobs:\n  build:\n    steps:\n      - uses: actions/checkout@v4\n        wiht: {}\n")
    result = validate_workflows([broken])
    assert result.returncode != 0
    assert "broken.yml" in result.stdout + result.stderr


def test_cibuildwheel_builds_one_wheel_per_platform():
    """One CPython builds the py3-none wheel, for x86_64 and aarch64 manylinux; cibuildwheel rejects
    unknown options, so this also validates [tool.cibuildwheel]."""
    if shutil.which("cibuildwheel") is None:
        pytest.skip("cibuildwheel is not installed (pip install linrec[test])")
    result = subprocess.run(["cibuildwheel", "--print-build-identifiers", "--platform", "linux"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["cp312-manylinux_x86_64", "cp312-manylinux_aarch64"]


def fake_wheel(directory: Path, name: str, files: dict[str, bytes]) -> Path:
    wheel = directory / name
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def check_wheel(path: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", **environment}
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "check_wheel.py"), str(path)], capture_output=True,
                          text=True, check=False, env=env)


def record(version: str, cuda: str | None) -> bytes:
    return json.dumps({"version": version, "torch_target": "2.10", "built_with_torch": "2.13.0",
                       "cuda": cuda, "cuda_targets": ["sm_90"] if cuda else []}).encode()


def test_check_wheel_accepts_a_good_wheel(tmp_path):
    wheel = fake_wheel(tmp_path, "linrec-0.1.0+cu12-py3-none-manylinux_2_28_x86_64.whl", {
        "linrec/_C.so": b"elf", "linrec/_C_cuda.so": b"elf", "linrec/_build_info.json": record("0.1.0+cu12", "12.8")})
    result = check_wheel(wheel, LINREC_CUDA_VERSION="12.8", LINREC_LOCAL_VERSION="cu12")
    assert result.returncode == 0, result.stderr


def test_check_wheel_names_every_problem(tmp_path):
    wheel = fake_wheel(tmp_path, "linrec-0.1.0-py3-none-manylinux_2_28_x86_64.whl", {
        "linrec/_C.so": b"elf", "linrec.libs/libtorch_cpu-1a2b3c.so": b"elf", "linrec/_build_info.json": record("0.1.0", None)})
    result = check_wheel(wheel, LINREC_CUDA_VERSION="13.0", LINREC_LOCAL_VERSION="cu13")
    assert result.returncode == 1
    assert "libtorch_cpu-1a2b3c.so" in result.stderr  # auditwheel grafted torch into the wheel
    assert "built for CUDA 13.0, the record says None" in result.stderr
    assert "LINREC_LOCAL_VERSION=cu13 but the version is 0.1.0" in result.stderr
    wrong_tag = fake_wheel(tmp_path, "linrec-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl", {})
    assert "not a py3-none" in check_wheel(wrong_tag).stderr
