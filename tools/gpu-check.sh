#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with wheels built on the CPU machine in dist/
# (default archs) and, optionally, dist-sm80/ (LINREC_CUDA_ARCHS=8.0, to see the unsupported-arch error
# on a newer GPU) and build/cmake/linrec_check_kernels (the CMake build's torch-free kernel check, run
# under compute-sanitizer, with tools/sanitize_selective_scan.py). Installs the wheel with --no-deps into the machine's torch, runs the whole
# test suite (CPU and CUDA), the benchmark and the tuning sweep. Logs go to $OUT (or ./gpu-check-out):
# env.txt, pytest.txt, bench.txt + CSV + PNG, tune.txt + CSV (skipped with LINREC_SKIP_TUNE=1), checks.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-gpu-check-out}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  sha256sum dist/linrec-*.whl
  python3 -m pip install --no-deps --force-reinstall dist/linrec-*.whl 2>&1 | tail -1
} 2>&1 | tee "$out/env.txt"
(cd /tmp && LINREC_HYPOTHESIS_PROFILE=gpu python3 -m pytest "$OLDPWD/tests" -q -rs -p no:cacheprovider 2>&1) | tee "$out/pytest.txt"
status=$?
python3 -m linrec bench --dtypes float32,bfloat16,float16 --out "$out" 2>&1 | tee "$out/bench.txt"
if [ "${LINREC_SKIP_TUNE:-0}" = 0 ]; then
  python3 -m linrec tune --dtypes float32,bfloat16 --out "$out" 2>&1 | tee "$out/tune.txt"
fi
{
  if compgen -G "dist-sm80/*.whl" >/dev/null; then
    python3 -m pip install -q --no-deps --target /tmp/linrec-sm80 dist-sm80/linrec-*.whl
    PYTHONPATH=/tmp/linrec-sm80 python3 - <<'PY'
import torch, linrec
print("loaded", linrec.__file__)
try:
    linrec.linrec(torch.randn(2, 5, device="cuda"), torch.rand(2, 5, device="cuda"))
    print("FAIL: no error from a build without kernels for this GPU")
except RuntimeError as error:
    print(type(error).__name__ + ":", error)
PY
  fi
  for tool in memcheck racecheck; do
    echo "compute-sanitizer --tool $tool python3 tools/sanitize_selective_scan.py"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 1800 compute-sanitizer --tool "$tool" --error-exitcode 3 \
      python3 tools/sanitize_selective_scan.py 2>&1 | tail -3
  done
  if [ -x build/cmake/linrec_check_selective_scan ]; then
    for tool in memcheck racecheck; do
      echo "compute-sanitizer --tool $tool build/cmake/linrec_check_selective_scan"
      timeout 1800 compute-sanitizer --tool "$tool" --error-exitcode 3 build/cmake/linrec_check_selective_scan 2>&1 | tail -3
    done
  fi
  if [ -x build/cmake/linrec_check_kernels ]; then
    for tool in memcheck racecheck; do
      echo "compute-sanitizer --tool $tool build/cmake/linrec_check_kernels 4097"
      # A time limit: a chained kernel waiting on a chunk that never comes would otherwise hang here.
      timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 3 build/cmake/linrec_check_kernels 4097 2>&1 | tail -3
    done
  fi
} 2>&1 | tee "$out/checks.txt"
exit $status
