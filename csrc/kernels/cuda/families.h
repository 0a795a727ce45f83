// The CUDA kernel families and what each one takes; launch.cu picks one per call.
#pragma once

#include <cuda_runtime_api.h>

#include "linrec/params.h"

namespace linrec::cuda {

// Pipe kernels (pipe_scan.cu): a segment of threads per sequence, tile after tile, coalesced along
// time. They take one sequence per row (no cu_seqlens) with a contiguous time dim in every operand
// they write, and a contiguous or broadcast (stride 0) one in every operand they read.
bool pipe_supports(const ForwardParams& params);
bool pipe_supports(const BackwardParams& params);
void launch_pipe_forward(const ForwardParams& params, cudaStream_t stream);
void launch_pipe_backward(const BackwardParams& params, cudaStream_t stream);

// Sequential kernels (sequential_scan.cu): one thread per sequence, any strides and packed sequences;
// neighbouring threads take neighbouring rows, so a layout whose channels are the innermost dim
// (batch, time, channels) is read coalesced across channels.
void launch_sequential_forward(const ForwardParams& params, cudaStream_t stream);
void launch_sequential_backward(const BackwardParams& params, cudaStream_t stream);

// A kernel whose attributes tell whether this build has code for the current device.
const void* probe_kernel();

}  // namespace linrec::cuda
