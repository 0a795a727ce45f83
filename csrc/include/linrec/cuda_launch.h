// Host entry points of the CUDA kernels. Torch-free: the op layer and the standalone executable
// both call them with a params struct and a stream.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "linrec/params.h"

// Throws std::runtime_error naming the failed call and CUDA's description of the error.
#define LINREC_CUDA_CHECK(call)                                                                 \
  do {                                                                                          \
    const cudaError_t linrec_status_ = (call);                                                  \
    if (linrec_status_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string("linrec: CUDA error in ") + #call + ": " +          \
                               cudaGetErrorName(linrec_status_) + " (" +                      \
                               cudaGetErrorString(linrec_status_) + ")");                       \
  } while (0)

namespace linrec::cuda {

// The bytes of zeroed workspace (params.workspace, 16-byte aligned) a launch of these params needs;
// 0 when the kernel it picks needs none.
int64_t workspace_bytes(const ForwardParams& params);
int64_t workspace_bytes(const BackwardParams& params);

void launch_forward(const ForwardParams& params, cudaStream_t stream);
void launch_backward(const BackwardParams& params, cudaStream_t stream);

// Throws a clear error when `device` cannot run this build's kernels (its arch is not compiled in,
// or the driver is too old for the CUDA runtime linked into linrec).
void check_device_supported(int device);

// The targets this library was compiled for, e.g. "sm_80,sm_90,sm_100,sm_120,compute_120".
const char* compiled_targets();

}  // namespace linrec::cuda
