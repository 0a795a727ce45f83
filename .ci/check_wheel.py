"""Checks built wheels before they ship: python .ci/check_wheel.py DIR_OR_WHEEL [...]

Each wheel must be one py3-none wheel for a manylinux platform (after auditwheel repair) or for
linux (straight from `pip wheel`), under 30 MB, hold the libraries and the build record, and carry
none of torch's or the driver's libraries (the user's torch and driver provide them). The build
record must match the environment the wheel was built with (LINREC_CUDA_VERSION, LINREC_NO_CUDA,
LINREC_LOCAL_VERSION), where those are set. Standard library only: it runs inside cibuildwheel's
containers. Exits 1 naming every problem found.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zipfile
from pathlib import Path

MAX_BYTES = 30 * 1000 * 1000
FOREIGN_LIBRARIES = re.compile(r"lib(torch|torch_cpu|torch_cuda|c10|c10_cuda|cuda)[.-]")
TAG = re.compile(r"^linrec-(?P<version>[^-]+)-py3-none-(?P<platform>(manylinux_\d+_\d+_|linux_)(x86_64|aarch64))\.whl$")


def problems_of(wheel: Path) -> list[str]:
    problems = []
    match = TAG.match(wheel.name)
    if match is None:
        return [f"{wheel.name}: not a py3-none linux or manylinux wheel of linrec"]
    size = wheel.stat().st_size
    if size >= MAX_BYTES:
        problems.append(f"{wheel.name}: {size / 1e6:.1f} MB, the limit is {MAX_BYTES / 1e6:.0f} MB")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = json.loads(archive.read("linrec/_build_info.json")) if "linrec/_build_info.json" in names else None
    foreign = [name for name in names if FOREIGN_LIBRARIES.search(name.rsplit("/", 1)[-1])]
    if foreign:
        problems.append(f"{wheel.name}: holds libraries the user's torch or driver provides: {', '.join(foreign)}")
    if "linrec/_C.so" not in names:
        problems.append(f"{wheel.name}: no linrec/_C.so")
    if info is None:
        return [*problems, f"{wheel.name}: no linrec/_build_info.json"]
    if info["version"] != match["version"]:
        problems.append(f"{wheel.name}: the build record says version {info['version']}")
    label = os.environ.get("LINREC_LOCAL_VERSION", "")
    if label and not match["version"].endswith(f"+{label}"):
        problems.append(f"{wheel.name}: LINREC_LOCAL_VERSION={label} but the version is {match['version']}")
    cuda_wanted = os.environ.get("LINREC_CUDA_VERSION", "")
    if os.environ.get("LINREC_NO_CUDA", "0") not in ("", "0"):
        cuda_wanted = None
    has_cuda_library = "linrec/_C_cuda.so" in names
    if cuda_wanted is None and (info["cuda"] is not None or has_cuda_library):
        problems.append(f"{wheel.name}: LINREC_NO_CUDA is set but the wheel holds CUDA kernels")
    if cuda_wanted and (info["cuda"] != cuda_wanted or not has_cuda_library):
        problems.append(f"{wheel.name}: built for CUDA {cuda_wanted}, the record says {info['cuda']} "
                        f"({'with' if has_cuda_library else 'without'} linrec/_C_cuda.so)")
    return problems


def main(paths: list[str]) -> int:
    wheels = [wheel for path in map(Path, paths) for wheel in (sorted(path.glob("*.whl")) if path.is_dir() else [path])]
    if not wheels:
        print("check_wheel: no wheel found in " + ", ".join(paths), file=sys.stderr)
        return 1
    problems = [problem for wheel in wheels for problem in problems_of(wheel)]
    for wheel in wheels:
        print(f"check_wheel: {wheel.name} {wheel.stat().st_size / 1e6:.1f} MB")
    for problem in problems:
        print(f"check_wheel: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
