// The fused selective scan's translation unit: its two kernel families, the lane family
// (ssm/lanes/) for Mamba's operands and the block family (ssm/blocks/) for the rest, and
// its decode step (ssm/step_kernels.cuh), instantiated for every element type of u (T), of varying B and
// C (W: T, or the state type S beside 16-bit T or a complex A).
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "linrec/cuda_launch.h"
#include "linrec/device_shape.h"
#include "linrec/dispatch.h"
#include "linrec/ssm/blocks/kernels.cuh"
#include "linrec/ssm/lanes/backward.cuh"
#include "linrec/ssm/lanes/forward.cuh"
#include "linrec/ssm/lanes/plan.cuh"
#include "linrec/ssm/step_kernels.cuh"

namespace linrec::cuda {
namespace {


// Calls body.template operator()<T, W, S>() for the call's element types (dispatch_scan_types). Varying B
// and C share one dtype (the op layer checks it).
template <typename Body>
void dispatch_types(const ssm::ForwardParams& params, Body&& body) {
  const bool wide = (params.B.varying && params.B.wide) || (params.C.varying && params.C.wide);
  dispatch_scan_types<__half, __nv_bfloat16>(params.dtype, params.state_dtype, wide, body);
}

// Raises `kernel`'s dynamic shared memory limit where it asks for more than the default 48 KB, after
// checking that the block's shared memory, the kernel's static arrays with `shared_bytes` (a multiple of
// the state dim n), fits this GPU's limit: else an error naming the largest n that fits.
template <typename Kernel>
void allow_shared(Kernel kernel, int64_t shared_bytes, int64_t n) {
  if (shared_bytes <= 48 * 1024) return;
  int device = 0, limit = 0;
  LINREC_CUDA_CHECK(cudaGetDevice(&device));
  LINREC_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  LINREC_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int64_t available = limit - static_cast<int64_t>(attributes.sharedSizeBytes);
  if (shared_bytes > available)
    throw std::invalid_argument("linrec: selective_scan: the state dim n = " + std::to_string(n) + " needs " +
                                std::to_string(shared_bytes + attributes.sharedSizeBytes) +
                                " bytes of shared memory per block, more than this GPU's " + std::to_string(limit) +
                                ": this call takes n <= " + std::to_string(available / (shared_bytes / n)) + " here");
  LINREC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
}

// Launches `kernel` with `shared_bytes` of dynamic shared memory, raising the kernel's limit where
// the state dim asks for more than the default 48 KB.
template <typename Policy, typename Params>
void launch_rows(void (*kernel)(Params), const Params& params, int64_t shared_bytes, cudaStream_t stream) {
  const int64_t rows = params.batch * params.d;
  if (rows == 0) return;
  if (rows > std::numeric_limits<int>::max())
    throw std::invalid_argument("linrec: selective_scan: batch * d = " + std::to_string(rows) +
                                " is more than the 2^31 - 1 blocks a launch can have");
  allow_shared(kernel, shared_bytes, params.n);
  kernel<<<static_cast<unsigned>(rows), Policy::kThreads, shared_bytes, stream>>>(params);
  LINREC_CUDA_CHECK(cudaGetLastError());
}


// Launches a lane-family kernel with one block per (batch row, group, kChannels channels) and time
// segment (grid y).
template <typename Policy, typename Params>
void launch_lanes(void (*kernel)(Params), const Params& params, int64_t segments, int64_t shared_bytes,
                  cudaStream_t stream) {
  const int64_t blocks = ssm::lanes::blocks_of<Policy>(params);
  if (blocks == 0 || segments == 0) return;
  if (blocks > std::numeric_limits<int>::max())
    throw std::invalid_argument("linrec: selective_scan: batch * d = " + std::to_string(params.batch * params.d) +
                                " needs more than the 2^31 - 1 blocks a launch can have");
  allow_shared(kernel, shared_bytes, params.n);
  // Shared memory before L1: the backward's blocks take about 70 KB each (85 KB at n = 128).
  LINREC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(segments));
  kernel<<<grid, Policy::kThreads, shared_bytes, stream>>>(params);
  LINREC_CUDA_CHECK(cudaGetLastError());
}

// Calls body.template operator()<T, W, Policy, Packed, Fixed>() for a call the lane family takes, with
// the plan's policy. Fixed B and C (both, in the state type) take W = T, which dispatch_types gives
// them, and n >= kFixedMinStates, which no policy of fewer state dims serves.
template <bool Backward, typename Body>
void dispatch_lanes(const ssm::Plan& plan, const ssm::ForwardParams& params, Body&& body) {
  dispatch_types(params, [&]<typename T, typename W, typename S>() {
    if constexpr (std::is_same_v<S, float>) {
      ssm::lanes::with_policy<Backward>(plan.lane_policy, params.n, [&]<typename Policy>() {
        const auto with_layout = [&]<bool Packed>() {
          if (params.B.varying) body.template operator()<T, W, Policy, Packed, false>();
          else if constexpr (std::is_same_v<W, T> && Policy::kMaxStates >= ssm::lanes::kFixedMinStates)
            body.template operator()<T, W, Policy, Packed, true>();
        };
        if (params.sequences.packed()) with_layout.template operator()<true>();
        else with_layout.template operator()<false>();
      });
    }
  });
}

// Copies the plan's split (and a backward's blocks of channels kept apart) into the params the kernels
// take.
template <typename Params>
Params split_as(const ssm::Plan& plan, const Params& params) {
  Params split = params;
  split.segments = plan.segments;
  split.segment_chunks = plan.segment_chunks;
  if constexpr (std::is_same_v<Params, ssm::BackwardParams>) split.channel_blocks = plan.channel_blocks;
  return split;
}

// The family that runs a call (ssm::Plan::family): the lane kernels where they take it.
ssm::Family family_of(bool lanes) { return lanes ? ssm::Family::Lanes : ssm::Family::Blocks; }

}  // namespace

ssm::Plan make_plan(const ssm::ForwardParams& params) {
  ssm::Plan plan;
  plan.family = family_of(ssm::lanes::takes(params));
  ssm::lanes::choose_plan<false>(params, plan);
  // The segments' end states and decay products, [2][segments - 1][batch * d][n].
  plan.workspace_bytes = 2 * (plan.segments - 1) * params.batch * params.d * params.n * int64_t(sizeof(float));
  return plan;
}

ssm::Plan make_plan(const ssm::BackwardParams& params) {
  ssm::Plan plan;
  plan.family = family_of(ssm::lanes::takes_backward(params));
  ssm::lanes::choose_plan<true>(params, plan);
  const bool varying = params.B.varying || params.C.varying;
  if (params.deterministic && varying) {
    // The lane kernels sum each block's terms over its channels in a fixed order; the blocks' sums are
    // then added in block order. The block kernels add varying terms atomically.
    if (plan.family != ssm::Family::Lanes)
      throw std::invalid_argument(
          "linrec.selective_scan_backward: deterministic sums of a varying B's or C's gradient on the GPU need B "
          "and C varying with the same groups, n <= " + std::to_string(ssm::lanes::kMaxStates) +
          " and a float32 state, got n = " + std::to_string(params.n) +
          (params.state_dtype == DType::Float32 ? "" : std::string(" and a ") + dtype_name(params.state_dtype) + " state"));
    ssm::lanes::with_policy<true>(plan.lane_policy, params.n, [&]<typename Policy>() {
      plan.channel_blocks = ssm::lanes::blocks_per_group<Policy>(params);
    });
  }
  plan.workspace_bytes = ssm::lanes::BackwardWorkspace::floats(split_as(plan, params)) * int64_t(sizeof(float));
  return plan;
}

void launch(const ssm::Plan& plan, const ssm::ForwardParams& params, cudaStream_t stream) {
  if (plan.family == ssm::Family::Lanes) {
    const ssm::ForwardParams split = split_as(plan, params);
    dispatch_lanes<false>(plan, params, [&]<typename T, typename W, typename Policy, bool Packed, bool Fixed>() {
      constexpr int64_t kShared = sizeof(ssm::lanes::ForwardShared<Policy, Fixed>);
      if (plan.segments > 1)
        launch_lanes<Policy>(ssm::lanes::forward_kernel<T, W, Policy, Packed, Fixed, true>, split, plan.segments - 1,
                             kShared, stream);
      launch_lanes<Policy>(ssm::lanes::forward_kernel<T, W, Policy, Packed, Fixed, false>, split, plan.segments,
                           kShared, stream);
    });
    return;
  }
  dispatch_types(params, [&]<typename T, typename W, typename S>() {
    using Policy = ssm::ForwardPolicy;
    // The state before the current chunk and the next, per state dim.
    const int64_t shared_bytes = 2 * params.n * int64_t(sizeof(S));
    if (params.sequences.packed())
      launch_rows<Policy>(ssm::forward_kernel<T, W, S, Policy, true>, params, shared_bytes, stream);
    else
      launch_rows<Policy>(ssm::forward_kernel<T, W, S, Policy, false>, params, shared_bytes, stream);
  });
}

void launch(const ssm::Plan& plan, const ssm::BackwardParams& params, cudaStream_t stream) {
  if (plan.family == ssm::Family::Lanes) {
    const ssm::BackwardParams split = split_as(plan, params);
    dispatch_lanes<true>(plan, params, [&]<typename T, typename W, typename Policy, bool Packed, bool Fixed>() {
      constexpr int64_t kShared = sizeof(ssm::lanes::BackwardShared<Policy, Fixed>);
      if (plan.segments > 1)
        launch_lanes<Policy>(ssm::lanes::backward_kernel<T, W, Policy, Packed, Fixed, true>, split, plan.segments - 1,
                             kShared, stream);
      launch_lanes<Policy>(ssm::lanes::backward_kernel<T, W, Policy, Packed, Fixed, false>, split, plan.segments,
                           kShared, stream);
    });
    // The sums' kernels only where they have sums: a launch of zero blocks is an error.
    if (plan.segments > 1 && params.batch * params.d > 0) {
      const int64_t sums = ssm::lanes::BackwardWorkspace::segment_sum_floats(params);
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((sums + 255) / 256, 65535));
      ssm::lanes::sum_segments<<<blocks, 256, 0, stream>>>(split);
      LINREC_CUDA_CHECK(cudaGetLastError());
    }
    if (plan.channel_blocks > 0 && ssm::lanes::BackwardWorkspace::projection_floats(params) > 0) {
      const int64_t sums = 2 * ssm::lanes::BackwardWorkspace::projection_floats(params);
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((sums + 255) / 256, 65535));
      ssm::lanes::sum_channel_blocks<<<blocks, 256, 0, stream>>>(split);
      LINREC_CUDA_CHECK(cudaGetLastError());
    }
    return;
  }
  dispatch_types(params, [&]<typename T, typename W, typename S>() {
    using Policy = ssm::BackwardPolicy;
    // The adjoints carried between chunks, and per-warp sums of d_A, fixed d_B and fixed d_C.
    const int64_t shared_bytes = (2 + 3 * Policy::kWarps) * params.n * int64_t(sizeof(S));
    if (params.sequences.packed())
      launch_rows<Policy>(ssm::backward_kernel<T, W, S, Policy, true>, params, shared_bytes, stream);
    else
      launch_rows<Policy>(ssm::backward_kernel<T, W, S, Policy, false>, params, shared_bytes, stream);
  });
}

ssm::Plan make_plan(const ssm::StateUpdateParams&) { return {}; }

// A float32 state of n <= 128 takes the lane kernels' arithmetic (the scan's bits), four lanes a channel
// up to n = 16, sixteen up to 64 and thirty-two up to 128; any other a warp a channel.
void launch(const ssm::Plan&, const ssm::StateUpdateParams& params, cudaStream_t stream) {
  const int64_t rows = params.batch * params.d;
  if (rows == 0) return;
  dispatch_types(params, [&]<typename T, typename W, typename S>() {
    const auto run = [&](void (*kernel)(ssm::StateUpdateParams), int64_t channels_per_block) {
      const int64_t blocks = (rows + channels_per_block - 1) / channels_per_block;
      if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("linrec: selective_state_update: batch * d = " + std::to_string(rows) +
                                    " needs more than the 2^31 - 1 blocks a launch can have");
      kernel<<<static_cast<unsigned>(blocks), ssm::step::kThreads, 0, stream>>>(params);
      LINREC_CUDA_CHECK(cudaGetLastError());
    };
    if constexpr (std::is_same_v<S, float>) {
      if (params.n <= 16) return run(ssm::step::lane_step_kernel<T, W, 4>, ssm::step::kThreads / 4);
      if (params.n <= 64) return run(ssm::step::lane_step_kernel<T, W, 16>, ssm::step::kThreads / 16);
      if (params.n <= ssm::lanes::kMaxStates) return run(ssm::step::lane_step_kernel<T, W, 32>, ssm::step::kThreads / 32);
    }
    run(ssm::step::warp_step_kernel<T, W, S>, ssm::step::kThreads / 32);
  });
}

}  // namespace linrec::cuda
