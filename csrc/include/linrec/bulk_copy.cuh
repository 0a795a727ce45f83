// Asynchronous bulk copies of tensor boxes between global and shared memory (the Tensor Memory
// Accelerator of sm_90 and newer): loads, with the shared-memory barriers that tell a block when a
// load has landed, and stores, waited for by the thread that issues them; and the host side that
// describes a tensor to the copy unit. A box is up to three dims of a tensor (channels, time, batch),
// innermost first; coordinates outside the tensor, negative ones included, load as zeros and are not
// stored, so tiles at the tensor's edges need no bounds checks.
#pragma once

#include <cuda.h>  // CUtensorMap: a type only; the encoder is fetched from the driver at run time
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace linrec::cuda {

// The device code of the copies exists for sm_90 and newer; other targets compile the kernels that
// use them as empty bodies, which their plans never choose.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LINREC_BULK_COPY_DEVICE 1
#endif

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// A barrier in shared memory that completes a phase when its one arrival has come and the bytes it
// expects have landed.
__device__ __forceinline__ void init_barrier(uint64_t* barrier) {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(barrier)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The arrival of the thread that issues a phase's copies, with the bytes they will write.
__device__ __forceinline__ void expect_bytes(uint64_t* barrier, uint32_t bytes) {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#endif
}

// Waits until the barrier has completed the phase of parity `phase`.
__device__ __forceinline__ void wait_barrier(uint64_t* barrier, uint32_t phase) {
#ifdef LINREC_BULK_COPY_DEVICE
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred complete;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        " selp.u32 %0, 1, 0, complete;\n}"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(phase)
        : "memory");
  }
#endif
}

// Copies the box at (channel, step, batch) of the tensor `map` describes into `destination`
// (128-byte aligned), counted on `barrier`.
__device__ __forceinline__ void load_box(void* destination, const CUtensorMap& map, int channel, int step, int batch,
                                         uint64_t* barrier) {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(channel), "r"(step), "r"(batch), "r"(shared_address(barrier))
      : "memory");
#endif
}

// Makes this thread's writes to shared memory visible to the copy unit: each thread that wrote a box
// calls it before the barrier after which one thread stores the box.
__device__ __forceinline__ void fence_writes_for_copies() {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Copies the box at `source` (128-byte aligned) to (channel, step, batch) of the tensor `map`
// describes; the parts of the box outside the tensor are not written. The stores a thread issues
// form a group once it commits them (commit_stores).
__device__ __forceinline__ void store_box(const CUtensorMap& map, const void* source, int channel, int step,
                                          int batch) {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(shared_address(source)), "r"(channel), "r"(step), "r"(batch)
               : "memory");
#endif
}

__device__ __forceinline__ void commit_stores() {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Waits until the groups of stores this thread committed have read their boxes (whose shared memory
// may then be written again).
__device__ __forceinline__ void wait_stores_read() {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

// Waits until the groups of stores this thread committed are written, and orders them before this
// thread's later accesses to global memory (a fence and an atomic then publish them to other blocks).
__device__ __forceinline__ void wait_stores_written() {
#ifdef LINREC_BULK_COPY_DEVICE
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

#endif  // __CUDACC__

// A tensor of `element_bytes`-byte elements as the copy unit reads it: `channels` contiguous
// elements, `steps` of them `time_stride` elements apart, `batches` of those `batch_stride` apart
// (strides in elements), in boxes of box_channels x box_steps x 1.
struct BoxedTensor {
  const void* data;
  int element_bytes;
  int64_t channels, steps, batches;
  int64_t time_stride, batch_stride;
  int box_channels, box_steps;
};

// Whether the copy unit can address the tensor: a 16-byte aligned start, strides of whole 16-byte
// units, and sizes it counts in 32 bits.
inline bool addressable(const BoxedTensor& tensor) {
  const int64_t bytes = tensor.element_bytes;
  const auto fits = [](int64_t value) { return value > 0 && value < (int64_t(1) << 31); };
  return reinterpret_cast<uintptr_t>(tensor.data) % 16 == 0 && tensor.time_stride * bytes % 16 == 0 &&
         (tensor.batches == 1 || tensor.batch_stride * bytes % 16 == 0) && fits(tensor.channels) &&
         fits(tensor.steps) && fits(tensor.batches) && tensor.time_stride > 0 &&
         (tensor.batches == 1 || tensor.batch_stride > 0);
}

// The copy unit's description of `tensor` (addressable() must hold). The encoder is the driver's,
// found once through the runtime (cudart is linked statically, the driver library is not linked).
inline CUtensorMap encode_tensor_map(const BoxedTensor& tensor) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr)
      throw std::runtime_error("linrec: the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  const int64_t bytes = tensor.element_bytes;
  const CUtensorMapDataType type = bytes == 2   ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                   : bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32
                                                : CU_TENSOR_MAP_DATA_TYPE_INT64;
  // A single batch never steps: any stride the encoder accepts stands in for it.
  const int64_t batch_stride_bytes = tensor.batches == 1 ? (tensor.steps * tensor.time_stride * bytes + 15) / 16 * 16
                                                         : tensor.batch_stride * bytes;
  const cuuint64_t sizes[3] = {static_cast<cuuint64_t>(tensor.channels), static_cast<cuuint64_t>(tensor.steps),
                               static_cast<cuuint64_t>(tensor.batches)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(tensor.time_stride * bytes),
                                 static_cast<cuuint64_t>(batch_stride_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(tensor.box_channels), static_cast<cuuint32_t>(tensor.box_steps), 1};
  const cuuint32_t unit_steps[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult result = encode(&map, type, 3, const_cast<void*>(tensor.data), sizes, strides, box, unit_steps,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw std::runtime_error("linrec: cuTensorMapEncodeTiled failed with CUDA driver error " + std::to_string(result));
  return map;
}

}  // namespace linrec::cuda
