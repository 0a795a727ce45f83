// The CUDA kernel family and what it takes; launch.cu calls it.
#pragma once

#include <cuda_runtime_api.h>

#include "linrec/params.h"

namespace linrec::cuda {

// Pipe kernels (pipe_scan.cu): segments of threads scan tiles of a sequence, coalesced along time
// where time is contiguous, across channels where it is not; sequences too few for the GPU are split
// across blocks (chained). They take any strides, and packed sequences (cu_seqlens) as resets inside
// a row. The chained configs need the workspace that workspace_bytes() (cuda_launch.h) reports.
void launch_pipe_forward(const ForwardParams& params, cudaStream_t stream);
void launch_pipe_backward(const BackwardParams& params, cudaStream_t stream);

// A kernel whose attributes tell whether this build has code for the current device.
const void* probe_kernel();

}  // namespace linrec::cuda
