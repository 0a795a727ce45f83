#!/usr/bin/env bash
# cibuildwheel's before-all (pyproject.toml): installs the CUDA toolkit LINREC_CUDA_VERSION (12.8,
# 13.0, ...) into the manylinux_2_28 container (AlmaLinux 8) from NVIDIA's rhel8 repository, as
# /usr/local/cuda. Without LINREC_CUDA_VERSION (the CPU variant) it installs nothing.
set -euxo pipefail
if [ -z "${LINREC_CUDA_VERSION:-}" ]; then
  echo "LINREC_CUDA_VERSION is not set: a CPU-only build, no CUDA toolkit"
  exit 0
fi
case "$(uname -m)" in
  x86_64) repo_arch=x86_64 ;;
  aarch64) repo_arch=sbsa ;;
  *) echo "no CUDA repository for $(uname -m)" >&2; exit 1 ;;
esac
dnf install -y dnf-plugins-core
dnf config-manager --add-repo "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${repo_arch}/cuda-rhel8.repo"
package_version=${LINREC_CUDA_VERSION/./-}
# nvcc and the runtime headers and static runtime: all the build uses (no other CUDA library).
dnf install -y "cuda-nvcc-${package_version}" "cuda-cudart-devel-${package_version}" "cuda-cccl-${package_version}"
ln -sfn "/usr/local/cuda-${LINREC_CUDA_VERSION}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
