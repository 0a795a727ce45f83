// The bulk family's plan: whether a call can take it (a strided time dim, channels contiguous, every
// box addressable by the copy unit, an sm_90 or newer GPU), its config, the persistent grid and the
// workspace; and the tensor maps its launch passes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>

#include "linrec/bulk/kernels.cuh"
#include "linrec/cuda_launch.h"
#include "linrec/device_shape.h"
#include "linrec/dispatch.h"
#include "linrec/plan.h"

namespace linrec::cuda::bulk {

// An operand as the copy unit addresses it, in boxes of `box_steps` steps.
inline BoxedTensor boxed(const SequenceLayout& layout, const Operand& operand, int element_bytes, int box_steps) {
  const int inner = layout.shape.num_dims - 1;
  const int64_t channels = layout.shape.sizes[inner];
  return {operand.data, element_bytes, channels, layout.seq_len, layout.num_rows() / channels,
          operand.time_stride, inner > 0 ? operand.strides[0] : 0, kChannels, box_steps};
}

// Whether an operand of the full shape fits the family: channels contiguous (stride 1) in whole
// 16-byte pieces, one batch dim at most beside them, neither broadcast, addressable by the copy unit,
// and every count of the call's chunks within 32 bits.
inline bool fits(const SequenceLayout& layout, const Operand& operand, int element_bytes) {
  const int inner = layout.shape.num_dims - 1;
  if (inner < 0 || inner > 1 || operand.strides[inner] != 1 || operand.time_stride <= 1) return false;
  if (inner == 1 && operand.strides[0] == 0) return false;
  const int64_t channels = layout.shape.sizes[inner];
  if (channels * element_bytes % 16 != 0 || layout.num_rows() >= (int64_t(1) << 31)) return false;
  return addressable(boxed(layout, operand, element_bytes, 1));
}

// The operands a call loads and stores in boxes, with their element sizes.
template <typename T, typename C>
bool operands_fit(const ForwardParams& params) {
  return fits(params, params.inputs, sizeof(T)) && fits(params, params.coeffs, sizeof(C)) &&
         fits(params, params.outputs, sizeof(T));
}
template <typename T, typename C>
bool operands_fit(const BackwardParams& params) {
  return !params.sum_d_coeffs && fits(params, params.d_outputs, sizeof(T)) && fits(params, params.coeffs, sizeof(C)) &&
         fits(params, params.outputs, sizeof(T)) && fits(params, params.d_inputs, sizeof(T)) &&
         fits(params, params.d_coeffs, sizeof(C));
}

inline Variant variant_of(const ForwardParams&) { return Variant::Plain; }
inline Variant variant_of(const BackwardParams& params) {
  return params.cu_seqlens != nullptr ? Variant::Packed : Variant::Plain;
}

template <typename Params>
constexpr bool kBackward = std::is_same_v<Params, BackwardParams>;

// Calls body.template operator()<T, C, Config>() with the call's element types and config, where the
// family is compiled for its element types; returns false (calling nothing) where it is not.
template <typename Params, typename Body>
bool with_kernel_types(const Params& params, bool reverse, Body&& body) {
  bool compiled = false;
  dispatch_dtypes<__half, __nv_bfloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
    if constexpr (compiled_for<T, C>()) {
      compiled = true;
      if (reverse) body.template operator()<T, C, BulkConfig{true}>();
      else body.template operator()<T, C, BulkConfig{false}>();
    }
  });
  return compiled;
}

// The kernel of a call: the forward, or the backward of the call's variant.
template <typename T, typename C, BulkConfig Config, typename Params>
auto kernel_of(Variant variant) {
  if constexpr (kBackward<Params>)
    return variant == Variant::Packed ? bulk_backward_kernel<T, C, Policy<Config>, Variant::Packed>
                                      : bulk_backward_kernel<T, C, Policy<Config>, Variant::Plain>;
  else return bulk_forward_kernel<T, C, Policy<Config>>;
}

template <typename T, typename C, typename Params>
constexpr int kDynamicSharedBytes = static_cast<int>(ring_bytes<T, C, kBackward<Params>>());

// Blocks of a kernel one SM holds at once on the current device, with its ring in dynamic shared
// memory (whose limit is raised to the ring once per device); 0 where the device runs the kernel from
// code compiled for an architecture without the copy unit (PTX of an older target), whose body is
// empty. Queried once per device and kernel.
template <typename T, typename C, BulkConfig Config, typename Params>
int resident_blocks(Variant variant) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices][2] = {};  // blocks + 1, per variant
  int device = 0;
  LINREC_CUDA_CHECK(cudaGetDevice(&device));
  const int slot = variant == Variant::Packed ? 1 : 0;
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && known[device][slot].load(std::memory_order_relaxed) > 0) return known[device][slot].load() - 1;
  const auto kernel = kernel_of<T, C, Config, Params>(variant);
  cudaFuncAttributes attributes{};
  LINREC_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  int blocks = 0;
  if (attributes.ptxVersion >= 90) {
    constexpr int kDynamicBytes = kDynamicSharedBytes<T, C, Params>;
    LINREC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicBytes));
    LINREC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, kDynamicBytes));
  }
  if (cached) known[device][slot].store(blocks + 1, std::memory_order_relaxed);
  return blocks;
}

// The call's plan on the bulk family, where it can take it: a persistent grid of as many blocks as
// the GPU holds at once (fewer where there are fewer chunks). A tile shape forced in the params names
// a config of the pipe family.
constexpr int64_t kMaxChunks = int64_t(1) << 30;

template <typename Params>
std::optional<Plan> make_plan(const Params& params) {
  if (params.num_rows() == 0 || params.seq_len < 2 || params.threads_per_sequence > 0) return std::nullopt;
  const DeviceShape device = device_shape();
  if (device.major < 9) return std::nullopt;
  std::optional<Plan> plan;
  with_kernel_types(params, params.reverse, [&]<typename T, typename C, BulkConfig Config>() {
    if (!operands_fit<T, C>(params)) return;
    using Thread = BulkThread<T, C, Config, kBackward<Params>>;
    const auto chain = Thread::chain_layout(params);
    // Chunk numbers, and the counter that hands them out past the last, stay within 32 bits.
    if (chain.num_blocks() > kMaxChunks) return;
    if (!takes<T>(chain.num_groups, device.multiprocessors)) return;
    const Variant variant = variant_of(params);
    const int blocks = resident_blocks<T, C, Config, Params>(variant);
    if (blocks == 0) return;
    Plan chosen;
    chosen.family = Family::Bulk;
    chosen.config = Config.reverse ? 1 : 0;
    chosen.schedule = Schedule::Chained;
    chosen.variant = variant;
    chosen.grid_blocks = std::min<int64_t>(chain.num_blocks(), static_cast<int64_t>(blocks) * device.multiprocessors);
    chosen.workspace_bytes = Thread::workspace_bytes(params);
    plan = chosen;
  });
  return plan;
}

// The tensor maps of a launch: the boxes of the operands the kernel loads and stores.
template <typename T, typename C>
BulkMaps tensor_maps(const ForwardParams& params) {
  constexpr int kSteps = kChunk<T>;
  return {encode_tensor_map(boxed(params, params.inputs, sizeof(T), kSteps)),
          encode_tensor_map(boxed(params, params.coeffs, sizeof(C), kSteps)),
          CUtensorMap{},
          {encode_tensor_map(boxed(params, params.outputs, sizeof(T), kSteps)), CUtensorMap{}},
          ChunkOrder::ByBlock};
}
template <typename T, typename C>
BulkMaps tensor_maps(const BackwardParams& params) {
  constexpr int kSteps = kChunk<T>;
  return {encode_tensor_map(boxed(params, params.d_outputs, sizeof(T), kSteps)),
          encode_tensor_map(boxed(params, params.coeffs, sizeof(C), kSteps + 1)),
          encode_tensor_map(boxed(params, params.outputs, sizeof(T), kSteps + 1)),
          {encode_tensor_map(boxed(params, params.d_inputs, sizeof(T), kSteps)),
           encode_tensor_map(boxed(params, params.d_coeffs, sizeof(C), kSteps))},
          ChunkOrder::ByBlock};
}

// The order in which a grid takes the chunks of `num_groups` groups (agent.cuh: ChunkOrder): from the
// counter where a round of the grid holds at most two chunks of a group.
inline ChunkOrder chunk_order(int64_t num_groups, int64_t grid_blocks) {
  return 2 * num_groups >= grid_blocks ? ChunkOrder::FromCounter : ChunkOrder::ByBlock;
}

// Launches a plan of make_plan on `stream`, as a cooperative launch: the driver starts the grid only
// with every block resident, which the look-back needs (a block waits for chunks of other blocks). A
// GPU that holds fewer blocks than the occupancy query said (a partition, or one shared with other
// processes) refuses the grid; the launch then halves it until the GPU takes it.
template <typename Params>
void launch(const Plan& plan, const Params& params, cudaStream_t stream) {
  if (plan.workspace_bytes > 0 && params.workspace == nullptr)
    throw std::invalid_argument("linrec: the bulk kernels need the workspace that their plan asks for");
  with_kernel_types(params, plan.config == 1, [&]<typename T, typename C, BulkConfig Config>() {
    using Thread = BulkThread<T, C, Config, kBackward<Params>>;
    BulkMaps maps = tensor_maps<T, C>(params);
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kDynamicSharedBytes<T, C, Params>;
    config.stream = stream;
    config.attrs = &cooperative;
    config.numAttrs = 1;
    for (int64_t grid = plan.grid_blocks;; grid = (grid + 1) / 2) {
      config.gridDim = dim3(static_cast<unsigned>(grid));
      maps.order = chunk_order(Thread::chain_layout(params).num_groups, grid);
      const auto kernel = kernel_of<T, C, Config, Params>(plan.variant);
      const cudaError_t status = cudaLaunchKernelEx(&config, kernel, params, maps);
      if (status != cudaErrorCooperativeLaunchTooLarge || grid == 1) {
        LINREC_CUDA_CHECK(status);
        break;
      }
      (void)cudaGetLastError();  // the refusal, cleared before the smaller grid's launch
    }
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace linrec::cuda::bulk
