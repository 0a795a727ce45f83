"""Builds linrec's native libraries against the installed torch's stable ABI.

Two shared libraries, neither of them a Python extension module (no Python C API, no pybind11):
  linrec/_C.so       op schemas and the CPU kernels
  linrec/_C_cuda.so  the CUDA kernels (cudart linked statically), built when nvcc is found
Both are loaded with torch.ops.load_library, so one wheel serves every CPython >= 3.10 and every
torch >= 2.10 (TORCH_TARGET_VERSION). nvcc compiles the .cu files directly, which works with the
CPU build of torch: torch.utils.cpp_extension.CUDAExtension would refuse it.

Environment:
  LINREC_NO_CUDA=1        build the CPU kernels only
  LINREC_CUDA_ARCHS=...   compute capabilities, ';'-separated, '+PTX' also embeds PTX, e.g. the
                          release wheels' "8.0;9.0;10.0;12.0+PTX" (default: those of the GPUs
                          nvidia-smi lists on this machine; none listed: the CPU kernels only);
                          the build log says which list it took and why
  CUDA_HOME               CUDA toolkit to use (else /usr/local/cuda, else the one nvcc on PATH is in)
  MAX_JOBS                parallel compile jobs (default: CPU count)
  LINREC_LOCAL_VERSION    a local version label for a wheel variant, e.g. cu12 -> 0.1.0+cu12
                          (the version itself is src/linrec/_version.py's)
  LINREC_LINEINFO=1       keep source lines in the device code, for profilers (ncu's source view);
                          off by default: with them the device code is twice as large
The build writes linrec/_build_info.json beside the libraries: what they were built for, which
`python -m linrec info` prints and the runtime checks compare with the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
TORCH_TARGET_VERSION = "0x020a000000000000"  # torch 2.10: the oldest torch the built libraries load into
CXX_STD = "-std=c++20"


def package_version() -> str:
    """src/linrec/_version.py's version, with LINREC_LOCAL_VERSION as its local label."""
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "src" / "linrec" / "_version.py").read_text()).group(1)
    label = os.environ.get("LINREC_LOCAL_VERSION", "")
    if label and not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", label):
        sys.exit(f"linrec build: LINREC_LOCAL_VERSION {label!r} is not a local version label such as cu12")
    return f"{version}+{label}" if label else version


def _log(message: str) -> None:
    print(f"linrec build: {message}", file=sys.stderr, flush=True)


def _torch_paths() -> tuple[Path, Path]:
    try:
        import torch  # noqa: PLC0415 - only the build needs torch's headers
    except ImportError:
        sys.exit(
            "linrec build: torch is not importable. linrec compiles against the torch already installed: "
            "install torch (>= 2.10) first, then `pip install --no-build-isolation .` "
            "(build isolation would download a second torch just for the build)."
        )
    torch_dir = Path(torch.__file__).parent
    return torch_dir / "include", torch_dir / "lib"


def find_cuda_home() -> Path | None:
    """The CUDA toolkit to build with: CUDA_HOME, CUDA_PATH, /usr/local/cuda, or the one nvcc on PATH is in."""
    candidates = [Path(os.environ[var]) for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    candidates.append(Path("/usr/local/cuda"))
    if shutil.which("nvcc"):
        candidates.append(Path(shutil.which("nvcc")).resolve().parent.parent)
    for home in candidates:
        if (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_runtime_api.h").is_file():
            return home.resolve()
    return None


def cuda_gencode_flags(arch_list: str) -> tuple[list[str], list[str]]:
    """'8.0;9.0+PTX' -> (nvcc -gencode flags, target names such as sm_80, compute_90)."""
    flags, targets = [], []
    for entry in filter(None, (item.strip() for item in arch_list.replace(",", ";").split(";"))):
        arch, _, suffix = entry.partition("+")
        if suffix.upper() not in ("", "PTX") or not arch.replace(".", "").isdigit() or "." not in arch:
            sys.exit(f"linrec build: LINREC_CUDA_ARCHS entry {entry!r} is not of the form 9.0 or 12.0+PTX")
        number = arch.replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        targets.append(f"sm_{number}")
        if suffix:
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
            targets.append(f"compute_{number}")
    if not flags:
        sys.exit("linrec build: LINREC_CUDA_ARCHS names no architecture")
    return flags, targets


def nvcc_version(nvcc: Path) -> str:
    """The CUDA release of an nvcc, e.g. '13.0'."""
    output = subprocess.run([str(nvcc), "--version"], check=True, capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", output)
    if match is None:
        sys.exit(f"linrec build: no CUDA release in the output of {nvcc} --version")
    return match.group(1)


def pipe_tile_shapes() -> dict[str, list[list[int]]]:
    """The CUDA pipe family's tile shapes by kind (row, chained, strided), from the one list of them
    (csrc/include/linrec/pipe/tile_shapes.inc), for the build record."""
    text = (ROOT / "csrc" / "include" / "linrec" / "pipe" / "tile_shapes.inc").read_text()
    shapes: dict[str, list[list[int]]] = {"row": [], "chained": [], "strided": []}
    for kind, threads, vectors in re.findall(r"^LINREC_PIPE_(ROW|CHAINED|STRIDED)_TILE\((\d+), (\d+)\)", text, re.M):
        shapes[kind.lower()].append([int(threads), int(vectors)])
    return shapes


class NativeLibrary(Extension):
    """A plain shared library (not a Python module) compiled from C++ and, with cuda_archs (compute
    capabilities as LINREC_CUDA_ARCHS writes them), CUDA sources."""

    def __init__(self, name: str, sources: list[str], cuda_archs: str | None = None):
        super().__init__(name, sources)
        self.cuda_archs = cuda_archs


class BuildNativeLibraries(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def run(self) -> None:
        import torch  # noqa: PLC0415 - only the build needs torch

        self.build_info = {
            "version": package_version(),
            "torch_target": ".".join(str(int(TORCH_TARGET_VERSION[2 + 2 * i:4 + 2 * i], 16)) for i in range(2)),
            "built_with_torch": torch.__version__,
            "cuda": None,
            "cuda_targets": [],
        }
        super().run()
        # Beside the libraries: in the build tree for wheels, in src/linrec for in-place builds.
        info_path = Path(self.get_ext_fullpath("linrec._C")).parent / "_build_info.json"
        info_path.write_text(json.dumps(self.build_info, indent=2) + "\n")
        _log(f"wrote {info_path}")

    def build_extensions(self) -> None:
        # Every source of every library compiles in one pool, the CUDA sources (the longest) first, so
        # that the CPU and CUDA libraries build side by side; then each library links.
        self.check_extensions_list(self.extensions)
        libraries = [self._library_plan(ext) for ext in self.extensions]
        compiles = sorted(((source, command) for _, commands, _ in libraries for source, command in commands),
                          key=lambda compile: not compile[0].endswith(".cu"))
        jobs = int(os.environ.get("MAX_JOBS", os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            list(pool.map(_run, (command for _, command in compiles)))
        for output, _, link in libraries:
            _run(link)
            _log(f"built {output}")

    def _library_plan(self, ext: NativeLibrary) -> tuple[Path, list[tuple[str, list[str]]], list[str]]:
        """The library's output path, its (source, compile command) pairs and its link command."""
        torch_include, torch_lib = _torch_paths()
        output = Path(self.get_ext_fullpath(ext.name))
        objects_dir = Path(self.build_temp) / ext.name
        objects_dir.mkdir(parents=True, exist_ok=True)
        output.parent.mkdir(parents=True, exist_ok=True)

        cxx = os.environ.get("CXX", "c++")
        defines = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]
        includes = [f"-I{ROOT / 'csrc' / 'include'}", "-isystem", str(torch_include)]
        # No contraction of a * b + c into fused multiply-adds: the compiler contracts or not per call
        # site, and the CPU kernels promise the same bits whatever the number of threads.
        host_flags = [CXX_STD, "-O3", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]
        link_flags = ["-shared", f"-L{torch_lib}"]
        nvcc = cuda_home = None
        cuda_flags: list[str] = []
        if ext.cuda_archs:
            cuda_home = find_cuda_home()
            nvcc = cuda_home / "bin" / "nvcc"
            gencode, targets = cuda_gencode_flags(ext.cuda_archs)
            _log(f"CUDA kernels for {','.join(targets)} with {nvcc}")
            cuda_release = nvcc_version(nvcc)
            self.build_info.update(cuda=cuda_release, cuda_targets=targets, pipe_tile_shapes=pipe_tile_shapes())
            # The fatbinary's device code compressed for size (nvcc >= 12.8): 5 times smaller than
            # nvcc 13.0's default, which keeps a wheel of 5 or 6 architectures under 30 MB.
            compress = ["--compress-mode=size"] if tuple(map(int, cuda_release.split("."))) >= (12, 8) else []
            cuda_flags = [*gencode, *compress]
            defines.append("-DUSE_CUDA")
            includes += [f"-I{objects_dir}", "-isystem", str(cuda_home / "include")]
            # A generated header rather than -D: nvcc splits -D values at commas.
            (objects_dir / "linrec_build_config.h").write_text(
                f'#pragma once\n#define LINREC_CUDA_TARGETS "{",".join(targets)}"\n')
            # libtorch.so pulls in libtorch_cuda.so on CUDA builds of torch, which defines
            # aoti_torch_get_current_cuda_stream; --no-as-needed keeps that dependency.
            link_flags += [f"-L{cuda_home / 'lib64'}", "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu",
                           "-Wl,--as-needed", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        else:
            link_flags += ["-ltorch_cpu"]

        objects, compiles = [], []
        for source in ext.sources:
            obj = objects_dir / (Path(source).name + ".o")
            if source.endswith(".cu"):
                lineinfo = ["-lineinfo"] if os.environ.get("LINREC_LINEINFO", "0") not in ("", "0") else []
                command = [str(nvcc), CXX_STD, "-O3", *lineinfo, "--threads", "2",
                           "-Xcompiler", "-fPIC,-fvisibility=hidden", "-Xptxas", "-warn-spills",
                           *cuda_flags, *defines, *includes, "-c", source, "-o", str(obj)]
            else:
                command = [cxx, *host_flags, *defines, *includes, "-c", source, "-o", str(obj)]
            compiles.append((source, command))
            objects.append(str(obj))
        return output, compiles, [cxx, *objects, *link_flags, "-o", str(output)]


def _run(command: list[str]) -> None:
    _log(" ".join(command))
    subprocess.run(command, check=True, cwd=ROOT)


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the libraries use no Python C API, so one wheel serves every CPython."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


def local_gpus() -> tuple[list[tuple[str, str]], str]:
    """The GPUs nvidia-smi lists on this machine as (name, compute capability) pairs and, where it lists
    none, why, for the build log."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return [], "nvidia-smi is not on PATH"
    try:
        result = subprocess.run([nvidia_smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], f"nvidia-smi failed ({error})"
    if result.returncode != 0:
        # nvidia-smi prints why (no driver loaded, a driver too old for compute_cap) on stdout.
        message = (result.stderr.strip() or result.stdout.strip() or f"exit status {result.returncode}").splitlines()[0]
        return [], f"nvidia-smi failed ({message})"
    gpus = []
    for line in result.stdout.splitlines():
        name, _, capability = line.rpartition(",")
        if re.fullmatch(r"\d+\.\d+", capability.strip()):
            gpus.append((name.strip(), capability.strip()))
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def choose_cuda_archs() -> tuple[str | None, str]:
    """The compute capabilities to build the CUDA kernels for (None: the CPU kernels only) and why, for
    the build log: LINREC_CUDA_ARCHS, else those of this machine's GPUs. Each architecture is a full
    nvcc pass over the kernels (four take about 14 minutes on 2 cores), so a source build compiles for
    the GPUs it will run on; a machine without a GPU has no use for CUDA kernels unless
    LINREC_CUDA_ARCHS asks for them, for other machines."""
    requested = os.environ.get("LINREC_CUDA_ARCHS")
    if requested:
        return requested, "as LINREC_CUDA_ARCHS asks"
    gpus, why_none = local_gpus()
    if not gpus:
        return None, f"{why_none} and LINREC_CUDA_ARCHS is not set"
    archs = sorted({capability for _, capability in gpus}, key=lambda arch: tuple(map(int, arch.split("."))))
    listed = ", ".join(f"{count} x {name} ({capability})" if count > 1 else f"{name} ({capability})"
                       for (name, capability), count in Counter(gpus).items())
    return ";".join(archs), (f"those of the GPUs nvidia-smi lists on this machine: {listed} "
                             "(LINREC_CUDA_ARCHS builds for others)")


def native_libraries() -> list[NativeLibrary]:
    # The longest compiles first (the rows family's two orders), so that the pool ends together.
    libraries = [NativeLibrary("linrec._C", ["csrc/kernels/cpu/rows_ascending.cpp", "csrc/kernels/cpu/rows_descending.cpp",
                                                "csrc/kernels/cpu/forward.cpp", "csrc/kernels/cpu/backward.cpp",
                                                "csrc/kernels/cpu/selective_scan.cpp", "csrc/kernels/schemas.cpp",
                                                "csrc/kernels/cpu/linrec_cpu.cpp"])]
    if os.environ.get("LINREC_NO_CUDA", "0") not in ("", "0"):
        _log("LINREC_NO_CUDA is set: building the CPU kernels only")
        return libraries
    if find_cuda_home() is None:
        _log("no CUDA toolkit found (set CUDA_HOME, or put nvcc on PATH): building the CPU kernels only")
        return libraries
    archs, reason = choose_cuda_archs()
    if archs is None:
        _log(f"building the CPU kernels only: {reason} "
             "(LINREC_CUDA_ARCHS names the compute capabilities to build CUDA kernels for)")
        return libraries
    _log(f"CUDA architectures {archs}: {reason}")
    libraries.append(NativeLibrary(
        "linrec._C_cuda", ["csrc/kernels/cuda/linrec_cuda.cpp", "csrc/kernels/cuda/device.cu",
                           "csrc/kernels/cuda/pipe_scan.cu", "csrc/kernels/cuda/bulk_scan.cu",
                           "csrc/kernels/cuda/scan_launch.cu", "csrc/kernels/cuda/selective_scan.cu",
                           "csrc/kernels/cuda/causal_conv.cu"],
        cuda_archs=archs))
    return libraries


# Guarded so that tests can import the functions above; pip and setuptools run this file as __main__.
if __name__ == "__main__":
    setup(
        version=package_version(),
        ext_modules=native_libraries(),
        cmdclass={"build_ext": BuildNativeLibraries, "bdist_wheel": PlatformWheel},
    )
