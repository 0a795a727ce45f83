// The pipe family's plan: for a call's params, the config (tile shape, access, schedule), the kernel
// variant, whether 16-bit channels go in pairs, the grid and the workspace; decided once per call,
// before the op layer allocates the workspace and launches (cuda_launch.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "linrec/cuda_launch.h"
#include "linrec/device_shape.h"
#include "linrec/dispatch.h"
#include "linrec/pipe/agent.cuh"
#include "linrec/plan.h"

namespace linrec::cuda::pipe {

inline bool is_aligned(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Whether every row of `operand` starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const SequenceLayout& layout, const Operand& operand) {
  bool aligned = is_aligned(operand.data);
  for (int d = 0; d < layout.shape.num_dims; ++d)
    aligned = aligned && operand.strides[d] * static_cast<int64_t>(sizeof(T)) % 16 == 0;
  return aligned;
}

inline bool contiguous_in_time(const Operand& operand) { return operand.time_stride == 1; }
inline bool readable_in_time(const Operand& operand) { return operand.time_stride == 1 || operand.time_stride == 0; }

// The operands of one call: those it reads (possibly broadcast) and those it writes (full shape).
struct OperandSet {
  std::vector<Operand> reads, writes;
};

inline OperandSet operands_of(const ForwardParams& params) { return {{params.inputs, params.coeffs}, {params.outputs}}; }
// The forward kernel is one for every call.
inline Variant variant_of(const ForwardParams&) { return Variant::Plain; }
inline Variant variant_of(const BackwardParams& params) {
  return params.sum_d_coeffs ? Variant::Summing : params.cu_seqlens != nullptr ? Variant::Packed : Variant::Plain;
}
// A summed d_coeffs is not among the writes: it is added into, not stored tile by tile.
inline OperandSet operands_of(const BackwardParams& params) {
  if (params.sum_d_coeffs) return {{params.d_outputs, params.coeffs, params.outputs}, {params.d_inputs}};
  return {{params.d_outputs, params.coeffs, params.outputs}, {params.d_inputs, params.d_coeffs}};
}

// The config for a call. Time-contiguous operands (read ones may be broadcast along time) take the
// row kernels: many sequences a pipe each, the smallest tile holding the whole sequence (else the
// largest, looping); few long ones chained across blocks; Vectorized (pipes) or the chains' aligned
// access where every row of every operand is aligned. A config forced in the params picks the tile
// shape of the row kernels. Other strides take the strided kernels, piped or chained by the same rule.
template <typename T, typename C>
PipeConfig choose_config(const SequenceLayout& layout, const OperandSet& operands, Variant variant,
                         int multiprocessors) {
  bool time_last = true, broadcast = false, aligned = layout.seq_len * static_cast<int64_t>(sizeof(T)) % 16 == 0;
  for (const Operand& operand : operands.reads) {
    time_last = time_last && readable_in_time(operand);
    broadcast = broadcast || operand.time_stride == 0;
    aligned = aligned && rows_aligned<T>(layout, operand);
  }
  for (const Operand& operand : operands.writes) {
    time_last = time_last && contiguous_in_time(operand);
    aligned = aligned && rows_aligned<T>(layout, operand);
  }
  // A forced tile shape names a config: the chained one (its shape is compiled for that schedule
  // only), else the pipe of that shape.
  const bool forced = layout.threads_per_sequence > 0;
  const bool few_rows = layout.num_rows() < static_cast<int64_t>(kPipeRowsPerMultiprocessor) * multiprocessors;
  const Access access = aligned ? Access::Vectorized : Access::Staged;
  const Access chained_access = aligned ? kChainedAlignedAccess<T> : Access::Staged;
  if (time_last && broadcast && (forced || !few_rows))
    return PipeConfig{kBroadcastTileShape[0], kBroadcastTileShape[1], layout.reverse, Access::Staged, true};
  if (time_last && !broadcast) {
    if (forced) {
      const bool chained = layout.threads_per_sequence == kChainedTileShape[0];
      return PipeConfig{layout.threads_per_sequence, layout.vectors_per_thread, layout.reverse,
                        chained ? chained_access : access, false, chained ? Schedule::Chained : Schedule::Pipe};
    }
    const PipeConfig chained{kChainedTileShape[0], kChainedTileShape[1], layout.reverse, chained_access, false,
                             Schedule::Chained};
    if (few_rows && layout.seq_len > tile_length<T>(chained)) return chained;
    for (const auto& [threads, vectors] : kTileShapes) {
      const PipeConfig pipe{threads, vectors, layout.reverse, access};
      if (compiled_for<T, C>(pipe, variant) && tile_length<T>(pipe) >= layout.seq_len) return pipe;
    }
    return PipeConfig{kTileShapes.back()[0], kTileShapes.back()[1], layout.reverse, access};
  }
  // Strided time, or few rows broadcast along time (one lane per row, rather than a pipe per row).
  const int64_t groups = (layout.num_rows() + kWarp - 1) / kWarp;
  PipeConfig strided{kStridedTileShape[0], kStridedTileShape[1], layout.reverse, Access::Strided};
  if (groups < static_cast<int64_t>(kPipeGroupsPerMultiprocessor) * multiprocessors &&
      layout.seq_len > tile_length<T>(strided))
    strided.schedule = Schedule::Chained;
  return strided;
}

template <typename Visit>
void for_each_operand(ForwardParams& params, Visit&& visit) {
  for (Operand* operand : {&params.inputs, &params.coeffs, &params.outputs, &params.initial}) visit(*operand);
}
template <typename Visit>
void for_each_operand(BackwardParams& params, Visit&& visit) {
  for (Operand* operand : {&params.d_outputs, &params.coeffs, &params.outputs, &params.initial, &params.d_inputs,
                           &params.d_coeffs, &params.d_initial})
    visit(*operand);
}

// Re-describes `params` over ChannelPair elements: the innermost batch dim (channels) counts pairs,
// and every stride is halved. Possible where every operand steps through that dim with stride 1
// (none is broadcast across channels), the dim is even, and every other stride and pointer keeps the
// pairs 2-element aligned; returns false (and leaves `params` as it was) otherwise.
template <typename T, typename Params>
bool pair_channels(Params& params) {
  const int inner = params.shape.num_dims - 1;
  if (inner < 0 || params.shape.sizes[inner] % 2 != 0) return false;
  bool pairable = true;
  for_each_operand(params, [&](Operand& operand) {
    if (operand.data == nullptr) return;
    pairable = pairable && operand.strides[inner] == 1 && operand.time_stride % 2 == 0 &&
               operand.segment_stride % 2 == 0 && reinterpret_cast<uintptr_t>(operand.data) % (2 * sizeof(T)) == 0;
    for (int d = 0; d < inner; ++d) pairable = pairable && operand.strides[d] % 2 == 0;
  });
  if (!pairable) return false;
  int64_t sizes[kMaxBatchDims];
  std::copy(params.shape.sizes, params.shape.sizes + kMaxBatchDims, sizes);
  sizes[inner] /= 2;
  params.shape = BatchShape::of(sizes, params.shape.num_dims);
  for_each_operand(params, [&](Operand& operand) {
    operand.time_stride /= 2;
    operand.segment_stride /= 2;
    for (int d = 0; d < inner; ++d) operand.strides[d] /= 2;
  });
  return true;
}

// Index of `config` in kPipeConfigs, the compiled configs; throws where it is not among them.
inline int config_index(const PipeConfig& config) {
  const auto found = std::find(kPipeConfigs.begin(), kPipeConfigs.end(), config);
  if (found == kPipeConfigs.end()) throw std::invalid_argument("linrec: no kernel is compiled for config " + describe(config));
  return static_cast<int>(found - kPipeConfigs.begin());
}

// Calls body.template operator()<T, C, Config>(launched) with the element types of inputs and of
// coefficients, the plan's config and the params of the launch (re-described over channel pairs where
// the plan pairs them).
template <typename Params, typename Body>
void with_kernel_types(const Plan& plan, const Params& params, Body&& body) {
  dispatch_dtypes<__half, __nv_bfloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
    const auto run = [&]<typename Element, typename CoeffElement>(const Params& launched) {
      dispatch_config<kPipeConfigs>(plan.config, [&]<PipeConfig Config>() {
        if constexpr (compiled_for<Element, CoeffElement>(Config))
          body.template operator()<Element, CoeffElement, Config>(launched);
        else
          throw std::invalid_argument("linrec: no kernel is compiled for config " + describe(Config) + " with " +
                                      dtype_name(params.dtype) + " inputs and " + dtype_name(params.coeff_dtype) +
                                      " coefficients");
      });
    };
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, C>) {
      if (plan.channel_pairs) {
        Params paired = params;
        pair_channels<T>(paired);
        return run.template operator()<ChannelPair<T>, ChannelPair<T>>(paired);
      }
    }
    run.template operator()<T, C>(params);
  });
}

// The plan of a call. 16-bit types along strided time take channel pairs where the layout allows, the
// call pipes and the coefficients are 16-bit too: pairs halve the channel groups, so that fewer blocks
// fill the GPU, each moving twice the bytes an access; chained, a pair holds twice a float lane's
// look-back state (docs/design.md, Strided time).
template <typename Params>
Plan make_plan(const Params& params) {
  Plan plan;
  plan.family = Family::Pipe;
  plan.variant = variant_of(params);
  dispatch_dtypes<__half, __nv_bfloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
    const PipeConfig config = choose_config<T, C>(params, operands_of(params), plan.variant, device_shape().multiprocessors);
    plan.config = config_index(config);
    plan.schedule = config.schedule;
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, C>) {
      Params paired = params;
      plan.channel_pairs = config.access == Access::Strided && config.schedule == Schedule::Pipe && pair_channels<T>(paired);
    }
  });
  with_kernel_types(plan, params, [&]<typename T, typename C, PipeConfig Config>(const Params& launched) {
    const auto chain = PipeThread<T, C, Config, false>::chain_layout(launched);
    plan.grid_blocks = Config.schedule == Schedule::Chained ? chain.num_blocks() : chain.num_groups;
    plan.workspace_bytes = Config.schedule == Schedule::Chained ? chain.bytes() : 0;
  });
  return plan;
}

}  // namespace linrec::cuda::pipe
