#!/usr/bin/env python3
"""Registers, stack, local memory (spills) and shared memory of every compiled CUDA kernel config.

    python tools/func_attrs.py [path/to/_C_cuda.so]     (default: the installed linrec's)

Reads the resource usage ptxas recorded in the library's SASS with `cuobjdump -res-usage` (no GPU
needed; `pip install nvidia-cuda-cuobjdump` provides cuobjdump where the toolkit lacks it) and
demangles the kernel names into their dtype and PipeConfig. Exits 1 if any kernel uses local memory
or a stack frame (register spills).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CONFIG = re.compile(
    r"pipe_(?P<direction>forward|backward)_kernel<(?P<dtype>[\w:<>]+), .*PipeConfig\{(?P<threads>\d+), (?P<vectors>\d+), "
    r"(?P<reverse>true|false), \(linrec::Access\)(?P<access>\d)(?:, (?P<broadcast>true|false))?"
    r"(?:, \(linrec::Schedule\)(?P<schedule>\d))?\}"
)
SEQUENTIAL = re.compile(r"sequential_(?P<direction>forward|backward)_kernel<(?P<dtype>.+?)\s*>\(")
DTYPES = {
    "float": "float32",
    "double": "float64",
    "__half": "float16",
    "__nv_bfloat16": "bfloat16",
    "linrec::Complex<float>": "complex64",
    "linrec::Complex<double>": "complex128",
}
ACCESS = {"0": "vectorized", "1": "staged", "2": "strided", "3": "coalesced"}  # linrec::Access, csrc/include/linrec/memio.h
SCHEDULE = {None: "", "0": "", "1": "+chain"}  # linrec::Schedule, csrc/kernels/cuda/pipe_scan.cu


def find_cuobjdump() -> str:
    candidates = [shutil.which("cuobjdump")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump"))
    spec = importlib.util.find_spec("nvidia")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates += [str(path) for path in Path(location).glob("cu*/bin/cuobjdump")]
    for candidate in filter(None, candidates):
        if Path(candidate).is_file():
            return candidate
    sys.exit("cuobjdump not found: put the CUDA toolkit's bin on PATH or `pip install nvidia-cuda-cuobjdump`")


def default_library() -> Path:
    spec = importlib.util.find_spec("linrec")
    if spec is None or spec.origin is None:
        sys.exit("linrec is not installed: pass the path of _C_cuda.so")
    return Path(spec.origin).parent / "_C_cuda.so"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", nargs="?", type=Path, default=None)
    library = parser.parse_args().library or default_library()
    dump = subprocess.run([find_cuobjdump(), "-res-usage", str(library)], check=True, capture_output=True, text=True)
    rows, arch, mangled = [], "?", None
    for line in dump.stdout.splitlines():
        if line.startswith("arch = "):
            arch = line.split("=")[1].strip()
        elif line.strip().startswith("Function "):
            mangled = line.strip()[len("Function "):].rstrip(":")
        elif mangled and "REG:" in line:
            usage = dict(item.split(":", 1) for item in line.split())
            name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
            rows.append((arch, name, usage))
            mangled = None
    print(f"{'arch':<7} {'kernel':<8} {'dtype':<10} {'threads':>7} {'vectors':>7} {'reverse':>7} {'access':>16} "
          f"{'REG':>4} {'STACK':>5} {'LOCAL':>5} {'SHARED':>6}")
    def order(row):
        match = CONFIG.search(row[1])
        return (row[0], row[1]) if not match else (row[0], match["direction"], match["dtype"], int(match["threads"]),
                                                    int(match["vectors"]), match["reverse"], match["access"])

    spilling = 0
    for arch, name, usage in sorted(rows, key=order):
        spilling += usage["STACK"] != "0" or usage["LOCAL"] != "0"
        match = CONFIG.search(name)
        if not match:
            sequential = SEQUENTIAL.search(name)
            if sequential:  # one thread per sequence: no tile config
                print(f"{arch:<7} {sequential['direction']:<8} {DTYPES.get(sequential['dtype'], sequential['dtype']):<10} "
                      f"{'sequential':>50} {usage['REG']:>4} {usage['STACK']:>5} {usage['LOCAL']:>5} {usage['SHARED']:>6}")
            else:
                print(f"{arch:<7} {name}: REG {usage['REG']} STACK {usage['STACK']} LOCAL {usage['LOCAL']}")
            continue
        print(
            f"{arch:<7} {match['direction']:<8} {DTYPES.get(match['dtype'], match['dtype']):<10} {match['threads']:>7} "
            f"{match['vectors']:>7} {match['reverse']:>7} {ACCESS[match['access']] + ('+bc' if match['broadcast'] == 'true' else '') + SCHEDULE[match['schedule']]:>16} {usage['REG']:>4} {usage['STACK']:>5} "
            f"{usage['LOCAL']:>5} {usage['SHARED']:>6}"
        )
    print(f"{len(rows)} kernels in {library}; {spilling} use a stack frame or local memory (spills)")
    sys.exit(1 if spilling else 0)


if __name__ == "__main__":
    main()
