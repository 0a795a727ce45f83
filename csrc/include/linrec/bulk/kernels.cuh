// The bulk family's kernels: the forward scan and the fused backward over a strided time dim, each a
// loop of its agent (agent.cuh) over the chunks its block takes. The arithmetic of a chunk is the
// strided pipe kernels' (pipe/kernels.cuh): sequence starts, initial states and log coefficients per
// chunk, one TileScan with the look-back as its prefix.
#pragma once

#include "linrec/bulk/agent.cuh"
#include "linrec/sequence_starts.h"

namespace linrec::cuda::bulk {

template <typename T, typename C, typename PolicyT>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<T, false>))
    bulk_forward_kernel(const __grid_constant__ ForwardParams params, const __grid_constant__ BulkMaps maps) {
#ifdef LINREC_BULK_COPY_DEVICE
  using Thread = BulkThread<T, C, PolicyT::config, false>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  const SequenceStarts<true> starts{params};
  Thread::run(params, maps, [&](Thread& thread, const Chunk& chunk, int stage) {
    const bool active = thread.active(chunk);
    const int64_t begin = chunk.begin + thread.rank * kItems;
    Acc value[kItems], coeff[kItems];
    thread.read(thread.first_slot(stage), value);
    thread.read(thread.coeff_slot(stage), coeff);
    if (params.log_coeffs) exponentiate(coeff);
    const C* initial = nullptr;
    if (params.initial.data != nullptr && active)
      initial = params.initial.row<const C>(params.shape.row_offsets(thread.row(chunk), params.initial).at[0]);
    const bool resets = restart_forward(starts, begin, value, coeff, initial, params.initial.segment_stride);
    auto prefix = thread.prefix(params, chunk);
    Thread::Scan::scan(value, coeff, thread.storage.scan, prefix, resets);
    thread.write_results(thread.first_slot(stage), value);
    __syncthreads();
    thread.store_results(maps.results[0], chunk, thread.first_slot(stage));
    return !all_finite(value);
  });
#endif
}

// d_inputs[l] = conj(coeffs[next]) * d_inputs[next] + d_outputs[l], scanning against the forward
// op's direction, d_coeffs[l] = d_inputs[l] * conj(outputs[prev]) (outputs[prev] of the first element:
// initial, or none), times coeffs[l] with log_coeffs, and d_initial = conj(coeffs[first]) * d_inputs[first].
template <typename T, typename C, typename PolicyT, Variant Kind>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<T, true>))
    bulk_backward_kernel(const __grid_constant__ BackwardParams params, const __grid_constant__ BulkMaps maps) {
#ifdef LINREC_BULK_COPY_DEVICE
  constexpr bool kForwardReverse = PolicyT::config.reverse;
  using Thread = BulkThread<T, C, PolicyT::config, true>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  const SequenceStarts<Kind == Variant::Packed> starts{params};
  // Rows of the extra-row boxes: coeffs[l] and outputs[prev] of this thread's item i are at
  // rank * kItems + i + these shifts; coeffs[next] at the other side of coeffs[l].
  constexpr int kCoeffShift = kForwardReverse ? 1 : 0;
  constexpr int kNextCoeffShift = kForwardReverse ? 0 : 1;
  constexpr int kPrevOutputShift = kForwardReverse ? 1 : 0;
  Thread::run(params, maps, [&](Thread& thread, const Chunk& chunk, int stage) {
    const bool active = thread.active(chunk);
    const int64_t begin = chunk.begin + thread.rank * kItems;
    const C* const coeff_slot = thread.coeff_slot(stage);
    Acc value[kItems], shifted_coeff[kItems], prev_output[kItems];
    thread.read(thread.first_slot(stage), value);
    thread.read(coeff_slot, shifted_coeff, kNextCoeffShift);
    thread.read(thread.output_slot(stage), prev_output, kPrevOutputShift);
    #pragma unroll
    for (int i = 0; i < kItems; ++i) {
      shifted_coeff[i] = conj(coefficient(shifted_coeff[i], params.log_coeffs));
      prev_output[i] = conj(prev_output[i]);
    }
    const bool has_initial = params.initial.data != nullptr && active;
    const auto offsets =
        params.shape.row_offsets(has_initial ? thread.row(chunk) : 0, params.initial, params.d_initial).at;
    const C* const initial = has_initial ? params.initial.row<const C>(offsets[0]) : nullptr;
    C* const d_initial = has_initial ? params.d_initial.row<C>(offsets[1]) : nullptr;
    // d_coeffs is zeroed below at the starts of sequences without an initial state.
    const uint32_t chunk_starts = restart_backward<kForwardReverse>(starts, begin, shifted_coeff, prev_output, initial,
                                                                    params.initial.segment_stride).starts;
    if (params.log_coeffs) {  // d/d(log c) = c * d/dc
      #pragma unroll
      for (int i = 0; i < kItems; ++i)
        prev_output[i] =
            prev_output[i] * coefficient(thread.item(coeff_slot, thread.rank * kItems + i + kCoeffShift), true);
    }
    auto prefix = thread.prefix(params, chunk);
    // The reset path throughout: two paths cost the backward registers (broadcast coefficients'
    // gradient summed: 1.48 -> 1.33 of torch.add on (16, 2048, 1024)).
    Thread::Scan::scan(value, shifted_coeff, thread.storage.scan, prefix);
    #pragma unroll
    for (int i = 0; i < kItems; ++i)
      prev_output[i] = chunk_starts >> i & 1u && d_initial == nullptr ? Acc(0) : value[i] * prev_output[i];
    // d_initial = conj(coeffs[start]) * d_inputs[start], the coefficient read from the box before any
    // thread writes d_coeffs over it.
    if (chunk_starts != 0 && d_initial != nullptr) {
      starts.for_each(begin, begin + kItems, [&](int64_t position, int64_t segment) {
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (begin + i == position) {
            const Acc start_coeff =
                coefficient(thread.item(coeff_slot, thread.rank * kItems + i + kCoeffShift), params.log_coeffs);
            d_initial[segment * params.d_initial.segment_stride] = static_cast<C>(conj(start_coeff) * value[i]);
          }
      });
    }
    if (params.initial.data != nullptr) __syncthreads();
    thread.write_results(thread.first_slot(stage), value);
    thread.write_results(thread.coeff_slot(stage), prev_output);
    __syncthreads();
    thread.store_results(maps.results[0], chunk, thread.first_slot(stage));
    thread.store_results(maps.results[1], chunk, thread.coeff_slot(stage));
    return !all_finite(value);
  });
#endif
}

}  // namespace linrec::cuda::bulk
