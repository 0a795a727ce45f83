// The pipe family's kernels: the forward scan and the fused backward, each a loop of its agent
// (agent.cuh) over the tiles of its sequences.
#pragma once

#include "linrec/coeff_gradient_sum.h"
#include "linrec/pipe/agent.cuh"
#include "linrec/sequence_starts.h"

namespace linrec::cuda::pipe {

template <typename T, typename C, typename PolicyT>
__global__ void __launch_bounds__(block_threads(PolicyT::config), min_blocks_forward<T>(PolicyT::config))
    pipe_forward_kernel(const __grid_constant__ ForwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  using Thread = PipeThread<T, C, Config, Config.reverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const auto offsets = thread.row_offsets(params, params.inputs, params.coeffs, params.outputs, params.initial).at;
  const T* const inputs = params.inputs.row<const T>(offsets[0]);
  const C* const coeffs = params.coeffs.row<const C>(offsets[1]);
  T* const outputs = params.outputs.row<T>(offsets[2]);
  const SequenceStarts<true> starts{params};
  // The initial states of the row's packed sequences (one without cu_seqlens), if any.
  const C* initial = params.initial.data != nullptr && thread.active ? params.initial.row<const C>(offsets[3]) : nullptr;
  // Past the row's end, coefficients are the identity's: 1 (log 1 = 0 with log_coeffs).
  const Acc coeff_fill = params.log_coeffs ? Acc(0) : Acc(1);

  const int64_t end_step = thread.end_step();
  const auto fetch_tile = [&](int64_t step, Acc(&input_items)[kItems], Acc(&coeff_items)[kItems]) {
    thread.fetch(params.inputs, inputs, step, input_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, coeff_fill);
  };
  Acc value[kItems], coeff[kItems];
  if constexpr (Thread::kPrefetch) fetch_tile(thread.first_step(), value, coeff);
  auto prefix = thread.make_prefix(storage, params);
  bool nonfinite = false;
  for (int64_t step = thread.first_step(); step < end_step; ++step) {
    const int64_t begin = thread.chunk_begin(step);
    if constexpr (!Thread::kPrefetch) fetch_tile(step, value, coeff);
    thread.template arrange<T>(value);
    thread.template arrange<C>(coeff);
    // One uniform branch per tile for the flag, and per chunk a search for the sequence starts in it
    // (one compare without cu_seqlens): branches per item cost the loop a fifth of its speed.
    if (params.log_coeffs) exponentiate(coeff);
    const bool resets = restart_forward(starts, begin, value, coeff, initial, params.initial.segment_stride);
    Acc next_value[kItems], next_coeff[kItems];
    if constexpr (Thread::kPrefetch)
      if (step + 1 < end_step) fetch_tile(step + 1, next_value, next_coeff);
    thread.scan(value, coeff, prefix, resets);
    thread.store(params.outputs, outputs, step, value);
    nonfinite = nonfinite || !all_finite(value);
    if constexpr (Thread::kPrefetch) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i], coeff[i] = next_coeff[i];
    }
  }
  thread.rescan_nonfinite(storage, params, nonfinite);
}

// d_inputs[l] = conj(coeffs[next]) * d_inputs[next] + d_outputs[l], scanning against the forward
// op's direction, d_coeffs[l] = d_inputs[l] * conj(outputs[prev]) (outputs[prev] of the first element:
// initial, or none), times coeffs[l] with log_coeffs, and d_initial = conj(coeffs[first]) * d_inputs[first].
// The Summing variant sums d_coeffs into broadcast coeffs' shape (BackwardParams::sum_d_coeffs).
template <typename T, typename C, typename PolicyT, Variant Kind>
__global__ void __launch_bounds__(block_threads(PolicyT::config))
    pipe_backward_kernel(const __grid_constant__ BackwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  constexpr bool kForwardReverse = Config.reverse;
  using Thread = PipeThread<T, C, Config, !kForwardReverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const int64_t length = thread.length;
  const auto offsets = thread.row_offsets(params, params.d_outputs, params.coeffs, params.outputs, params.d_inputs,
                                          params.d_coeffs, params.initial, params.d_initial).at;
  const T* const d_outputs = params.d_outputs.row<const T>(offsets[0]);
  const C* const coeffs = params.coeffs.row<const C>(offsets[1]);
  const T* const outputs = params.outputs.row<const T>(offsets[2]);
  T* const d_inputs = params.d_inputs.row<T>(offsets[3]);
  C* const d_coeffs = params.d_coeffs.row<C>(offsets[4]);
  // Where the forward op's recurrence starts over.
  const SequenceStarts<Kind == Variant::Packed || Kind == Variant::Summing> starts{params};
  constexpr bool sums = Kind == Variant::Summing;
  const bool has_initial = params.initial.data != nullptr && thread.active;
  const C* initial = has_initial ? params.initial.row<const C>(offsets[5]) : nullptr;
  C* const d_initial = has_initial ? params.d_initial.row<C>(offsets[6]) : nullptr;
  // Broadcast coefficients: their gradient is summed here, into coeffs' shape.
  using CoeffSum = CoeffGradientSum<Acc, Thread::kSegmentLanes, Thread::kSegmentWarps, kItems, block_threads(Config)>;
  [[maybe_unused]] const auto coeff_sum_row = [&params] {
    const int64_t sequence = Thread::sequence_of(params);
    return params.shape.template row_pointers<Acc>(sequence < params.num_rows() ? sequence : 0, params.d_coeffs).at[0];
  };
  if constexpr (sums) CoeffSum::start(params.d_coeffs);

  const int64_t end_step = thread.end_step();
  // A tile needs its three chunks and, from the neighbouring chunks (L1 hits: the neighbour threads
  // load them too), the coefficient just after this thread's chunk and the output just before it,
  // in the forward direction. Past the row's end all values are 0: whatever coefficient is filled in
  // there only multiplies zeros.
  const auto fetch_tile = [&](int64_t step, Acc(&d_output_items)[kItems], Acc(&coeff_items)[kItems],
                              Acc(&output_items)[kItems], Acc& next_coeff_after, Acc& next_output_before) {
    thread.fetch(params.d_outputs, d_outputs, step, d_output_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, Acc(0));
    thread.fetch(params.outputs, outputs, step, output_items, Acc(0));
    const int64_t begin = thread.chunk_begin(step);
    next_coeff_after = load_one(coeffs, Thread::read_stride(params.coeffs), kForwardReverse ? begin - 1 : begin + kItems, length, Acc(0));
    next_output_before = load_one(outputs, Thread::full_stride(params.outputs), kForwardReverse ? begin + kItems : begin - 1, length, Acc(0));
  };

  Acc value[kItems], coeff[kItems], output[kItems], coeff_after, output_before;
  if constexpr (Thread::kPrefetch) fetch_tile(thread.first_step(), value, coeff, output, coeff_after, output_before);
  auto prefix = thread.make_prefix(storage, params);
  bool nonfinite = false;
  for (int64_t step = thread.first_step(); step < end_step; ++step) {
    const int64_t begin = thread.chunk_begin(step);
    if constexpr (!Thread::kPrefetch) fetch_tile(step, value, coeff, output, coeff_after, output_before);
    thread.template arrange<T>(value);
    thread.template arrange<C>(coeff);
    thread.template arrange<T>(output);
    // shifted_coeff: conj of the next coefficient in the forward direction; prev_output: the factor
    // that turns d_inputs into d_coeffs, conj(previous output) (times the coefficient with log_coeffs).
    if (params.log_coeffs) {
      exponentiate(coeff);
      coeff_after = coefficient(coeff_after, true);
    }
    Acc shifted_coeff[kItems], prev_output[kItems];
    #pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int next = kForwardReverse ? i - 1 : i + 1, prev = kForwardReverse ? i + 1 : i - 1;
      shifted_coeff[i] = conj(next >= 0 && next < kItems ? coeff[next] : coeff_after);
      prev_output[i] = conj(prev >= 0 && prev < kItems ? output[prev] : output_before);
    }
    // d_coeffs is zeroed below at the starts of sequences without an initial state.
    const ChunkRestarts restarts =
        restart_backward<kForwardReverse>(starts, begin, shifted_coeff, prev_output, initial, params.initial.segment_stride);
    const uint32_t chunk_starts = restarts.starts;
    if (params.log_coeffs) {  // d/d(log c) = c * d/dc
      #pragma unroll
      for (int i = 0; i < kItems; ++i) prev_output[i] = prev_output[i] * coeff[i];
    }
    // coeff and output are consumed above: they take the next tile's values.
    Acc next_value[kItems];
    if constexpr (Thread::kPrefetch)
      if (step + 1 < end_step) fetch_tile(step + 1, next_value, coeff, output, coeff_after, output_before);
    thread.scan(value, shifted_coeff, prefix, restarts.resets);
    #pragma unroll
    for (int i = 0; i < kItems; ++i) prev_output[i] = value[i] * prev_output[i];
    // Without an initial state a start's coefficient takes no part. With one, d_initial =
    // conj(coeffs[start]) * d_inputs[start], the coefficient read again (coeff[] may hold the next tile
    // by now) and the starts' sequences found again: only in the chunks that hold a start.
    if (chunk_starts != 0 && d_initial == nullptr) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i)
        if (chunk_starts >> i & 1u) prev_output[i] = Acc(0);
    } else if (chunk_starts != 0) {
      starts.for_each(begin, begin + kItems, [&](int64_t position, int64_t segment) {
        const Acc start_coeff = coefficient(load_one(coeffs, Thread::read_stride(params.coeffs), position, length, Acc(0)),
                                            params.log_coeffs);
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (begin + i == position) d_initial[segment * params.d_initial.segment_stride] = static_cast<C>(conj(start_coeff) * value[i]);
      });
    }
    thread.store(params.d_inputs, d_inputs, step, value);
    nonfinite = nonfinite || !all_finite(value);
    if constexpr (sums) CoeffSum::add(params.d_coeffs, coeff_sum_row, params.seq_len, prev_output, begin, length);
    else thread.store(params.d_coeffs, d_coeffs, step, prev_output);
    if constexpr (Thread::kPrefetch) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i];
    }
  }
  if constexpr (sums) CoeffSum::finish(params.d_coeffs, coeff_sum_row);
  thread.rescan_nonfinite(storage, params, nonfinite);
}

// The rescan of a chained launch's sequences with non-finite results (nonfinite_rescan.h), launched
// after it on the same stream, whose kernel boundary orders every chunk's results before the rescan:
// a block per group of sequences, a warp per sequence.
constexpr int kRescanWarps = 4;

// Launched as a programmatic dependent of the chained kernel where the GPU has them (sm_90 and newer:
// pipe_scan.cu), so that its launch overlaps the chained kernel's last blocks; it then waits here
// until that kernel has completed and its stores are visible.
template <typename T, typename C, typename PolicyT, typename Params>
__global__ void __launch_bounds__(kRescanWarps * kWarp) pipe_rescan_kernel(const __grid_constant__ Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  PipeThread<T, C, PolicyT::config, false>::rescan_flagged(params);
}

}  // namespace linrec::cuda::pipe
