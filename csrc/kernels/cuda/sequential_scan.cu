// The sequential kernels: one thread scans one sequence (a row, or one packed sequence of a row)
// element after element through the operands' strides, with the code the CPU runs
// (sequential_scan.h). They take every layout; launch.cu sends them what the pipe kernels do not.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "families.h"
#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"
#include "linrec/sequential_scan.h"

namespace linrec::cuda {
namespace {

constexpr int kBlockThreads = 128;

// Sequences are numbered segment-major, so consecutive threads take consecutive rows of one packed
// sequence: the innermost batch dim, read coalesced when its stride is 1.
template <typename Params>
__device__ __forceinline__ bool sequence_of_thread(const Params& params, int64_t& row, int64_t& segment) {
  const int64_t sequence = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  const int64_t rows = params.num_rows();
  if (sequence >= rows * params.num_segments) return false;
  row = sequence % rows;
  segment = sequence / rows;
  return true;
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) sequential_forward_kernel(ForwardParams params) {
  int64_t row, segment;
  if (sequence_of_thread(params, row, segment)) sequential_scan_forward<1, T>(params, {row}, segment);
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) sequential_backward_kernel(BackwardParams params) {
  int64_t row, segment;
  if (sequence_of_thread(params, row, segment)) sequential_scan_backward<1, T>(params, {row}, segment);
}

dim3 grid_for(const SequenceLayout& layout) {
  return dim3(static_cast<unsigned>((layout.num_rows() * layout.num_segments + kBlockThreads - 1) / kBlockThreads));
}

}  // namespace

void launch_sequential_forward(const ForwardParams& params, cudaStream_t stream) {
  dispatch_dtype<__half, __nv_bfloat16>(params.dtype, [&]<typename T>() {
    sequential_forward_kernel<T><<<grid_for(params), kBlockThreads, 0, stream>>>(params);
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

void launch_sequential_backward(const BackwardParams& params, cudaStream_t stream) {
  dispatch_dtype<__half, __nv_bfloat16>(params.dtype, [&]<typename T>() {
    sequential_backward_kernel<T><<<grid_for(params), kBlockThreads, 0, stream>>>(params);
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

const void* probe_kernel() { return reinterpret_cast<const void*>(sequential_forward_kernel<float>); }

}  // namespace linrec::cuda
