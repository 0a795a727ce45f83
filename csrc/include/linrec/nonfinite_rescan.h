// The recurrence's IEEE answer where a parallel scan cannot give it. A parallel scan composes
// coefficients into products, which underflow to 0 or overflow to Inf where the sequential recurrence
// never forms them: an Inf state times an underflowed product is NaN where the loop keeps +-Inf, and
// a product that overflows times a zero state is NaN where the loop keeps 0. Such differences only
// arise in a sequence whose parallel result holds a non-finite value: a sequence whose loop result
// holds one gets one in the parallel result too, at the loop's first non-finite step at the latest,
// since every step there is computed from a finite, accurate state. So the parallel kernels note
// whether they wrote a non-finite result, and the packed sequences (whole rows without cu_seqlens)
// that hold one are scanned again, element after element, by the plain recurrence
// (sequential_scan.h), which stores its results from the first non-finite parallel result on: the
// results before it, and every other sequence's, keep the parallel kernels' bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "linrec/numeric.h"
#include "linrec/params.h"
#include "linrec/sequential_scan.h"

namespace linrec {

// The steps, in scan order from the first of [begin, end) (the last with `reverse`), before the first
// non-finite value of `row` (time stride `stride`); -1 where all are finite.
template <typename T>
LINREC_HOST_DEVICE int64_t steps_before_nonfinite(const T* row, int64_t stride, int64_t begin, int64_t end,
                                                  bool reverse) {
  using Acc = accumulator_t<T>;
  for (int64_t n = 0; n < end - begin; ++n) {
    const int64_t t = reverse ? end - 1 - n : begin + n;
    if (!is_finite(static_cast<Acc>(row[t * stride]))) return n;
  }
  return -1;
}

// The results a rescan rewrites, whose values decide it, and the direction it scans them in: the
// forward's outputs, and the backward's d_inputs (d_coeffs and d_initial follow from them), which it
// scans against the forward.
LINREC_HOST_DEVICE const Operand& rescanned(const ForwardParams& params) { return params.outputs; }
LINREC_HOST_DEVICE const Operand& rescanned(const BackwardParams& params) { return params.d_inputs; }
LINREC_HOST_DEVICE bool rescan_reverse(const ForwardParams& params) { return params.reverse; }
LINREC_HOST_DEVICE bool rescan_reverse(const BackwardParams& params) { return !params.reverse; }

template <typename T, typename C>
LINREC_HOST_DEVICE void sequential_scan(const ForwardParams& params, const int64_t (&rows)[1], int64_t segment,
                                        int64_t from_step) {
  sequential_scan_forward<1, T, C>(params, rows, segment, from_step);
}
template <typename T, typename C>
LINREC_HOST_DEVICE void sequential_scan(const BackwardParams& params, const int64_t (&rows)[1], int64_t segment,
                                        int64_t from_step) {
  sequential_scan_backward<1, T, C>(params, rows, segment, from_step);
}

// Rescans packed sequence `segment` of row `row` from its first non-finite result, if it has one. C is
// the element type of coeffs and initial (sequential_scan.h).
template <typename T, typename C, typename Params>
LINREC_HOST_DEVICE void rescan_segment(const Params& params, int64_t row, int64_t segment) {
  const T* results = params.shape.template row_pointers<T>(row, rescanned(params)).at[0];
  const int64_t first = steps_before_nonfinite(results, rescanned(params).time_stride, params.boundary(segment),
                                               params.boundary(segment + 1), rescan_reverse(params));
  const int64_t rows[1] = {row};
  if (first >= 0) sequential_scan<T, C>(params, rows, segment, first);
}

#if defined(__CUDACC__)

}  // namespace linrec

#include "linrec/block_scan.h"

namespace linrec {

// Whether every item is finite. For real items, one fused multiply-add an item: the sum of the items
// times 0 is 0 where all are finite and NaN where one is Inf or NaN (a test per item costs three).
template <typename Acc, int Items>
__device__ __forceinline__ bool all_finite(const Acc (&items)[Items]) {
  if constexpr (std::is_floating_point_v<Acc>) {
    Acc witness = Acc(0);
    #pragma unroll
    for (int i = 0; i < Items; ++i) witness = fma(items[i], Acc(0), witness);
    return witness == Acc(0);
  } else {
    bool finite = true;
    #pragma unroll
    for (int i = 0; i < Items; ++i) finite = finite && is_finite(items[i]);
    return finite;
  }
}

// Params over the scalar channels of params over channel pairs (pair_channels in reverse): the
// innermost batch dim counts channels again and every other stride doubles; pair row r holds
// channels 2r and 2r + 1, rescanned one by one so that a non-finite value in one channel of a pair
// leaves the other's bits alone.
template <typename Params, int Count>
__device__ Params unpaired(Params& params, Operand* const (&operands)[Count]) {
  const int inner = params.shape.num_dims - 1;
  params.shape.sizes[inner] *= 2;
  params.shape.rows *= 2;
  for (Operand* operand : operands) {
    operand->time_stride *= 2;
    operand->segment_stride *= 2;
    for (int d = 0; d < inner; ++d) operand->strides[d] *= 2;
  }
  return params;
}

__device__ inline ForwardParams unpaired(ForwardParams params) {
  Operand* const operands[] = {&params.inputs, &params.coeffs, &params.outputs, &params.initial};
  return unpaired(params, operands);
}

__device__ inline BackwardParams unpaired(BackwardParams params) {
  Operand* const operands[] = {&params.d_outputs, &params.coeffs,   &params.outputs,  &params.initial,
                               &params.d_inputs,  &params.d_coeffs, &params.d_initial};
  return unpaired(params, operands);
}

// How far a rescan loads ahead of its walk: a lane its row's next `lane_steps` steps, a warp its
// row's next `warp_slices` x 32. Deeper hides more load latency and takes more registers. A kernel
// that may rescan at its end pays for the rescan's registers on every call, finite or not: a
// kernel's register count is the largest of its call graph's, __noinline__ callees included
// (complex64 pipe kernels take 100-150 registers with depth {16, 8} where they take 64-122 without,
// and the strided complex64 forward reads 0.61 of torch.add against 0.90).
struct RescanDepth {
  int lane_steps;
  int warp_slices;
};
// Rescans at the end of a pipe kernel: within the registers that the pipe kernels take themselves
// (float32, warp rescan alone: 64 forward, 88 backward; with the lane rescan, for strided time: 80
// and 103; the leanest time-contiguous pipe kernels take 76 and 96, the strided ones 80 and 122).
inline constexpr RescanDepth kScanEndDepth{2, 4};
// Rescans by a kernel of their own (pipe_rescan_kernel) or by bulk blocks, whose scan already takes
// as many registers as its launch bounds allow.
inline constexpr RescanDepth kOwnDepth{8, 8};

// A rescan by the 32 lanes of a warp. Past the loop's first non-finite state every state is +-Inf or
// NaN: NaN stays NaN, and c * s + x only sets the sign of an infinite s or turns it NaN (c zero or NaN,
// x NaN or the opposite infinity). So from there the loop's states are those of the recurrence
// s = c' * s + x', with c' the sign of c (NaN where c is 0 or NaN) and x' = x where x is not finite
// (else 0): its products of coefficients are +-1 or NaN and its sums infinities of one sign or NaN,
// exact in any order, so that a warp scan of 32 steps at a time gives the loop's states. Before that
// state the warp walks the loop itself, 32 steps loaded at once: from the first non-finite parallel
// result, which is at or before the loop's first non-finite state (the file's comment), starting from
// the stored result before it (for 16-bit types the state rounded to T); that walk is usually one step.
// A NaN state fills the rest of the sequence with NaN without reading it.
namespace warp_rescan {

constexpr int kLanes = 32;
constexpr unsigned kAll = 0xffffffffu;

// The step of the recurrence past the first non-finite state (above).
template <typename Acc>
__device__ __forceinline__ Affine<Acc> nonfinite_step(Acc coeff, Acc input) {
  const Acc nan = Acc(0) / Acc(0);
  const Acc sign = coeff == Acc(0) || coeff != coeff ? nan : copysign(Acc(1), coeff);
  return {sign, is_finite(input) ? Acc(0) : input, Acc(0)};
}

// The first step, in walk order, of the `length` whose `value(n)` is not finite, or -1.
template <int Slices, typename Value>
__device__ __forceinline__ int64_t first_nonfinite(int64_t length, Value&& value) {
  const int lane = threadIdx.x % kLanes;
  for (int64_t base = 0; base < length; base += Slices * kLanes) {
    bool nonfinite[Slices];
    #pragma unroll
    for (int j = 0; j < Slices; ++j) {
      const int64_t n = base + j * kLanes + lane;
      nonfinite[j] = n < length && !is_finite(value(n));
    }
    #pragma unroll
    for (int j = 0; j < Slices; ++j) {
      const unsigned found = __ballot_sync(kAll, nonfinite[j]);
      if (found != 0) return base + j * kLanes + __ffs(found) - 1;
    }
  }
  return -1;
}

// Walks a sequence of `length` steps from step `from` with state `state`, the warp's lanes together:
// load(n, coeff, input) reads step n's coefficient and input (in the recurrence's walk order; step 0's
// coefficient is not used where `first_replaces`, the first state then being the input alone), and
// store(n, state) writes its result. Returns the last step's state (every lane).
template <int Slices, typename Acc, typename Load, typename Store>
__device__ __forceinline__ Acc walk(int64_t length, int64_t from, Acc state, bool first_replaces, Load&& load,
                                     Store&& store) {
  const int lane = threadIdx.x % kLanes;
  int64_t base = from;
  // The loop itself while the state is finite (a warp-uniform condition: every lane holds it).
  while (base < length && is_finite(state)) {
    const int64_t n = base + lane;
    Acc coeff = Acc(1), input = Acc(0);
    if (n < length) load(n, coeff, input);
    Acc mine = Acc(0);
    int done = 0;
    for (; done < kLanes && base + done < length; ++done) {
      const Acc step_coeff = __shfl_sync(kAll, coeff, done), step_input = __shfl_sync(kAll, input, done);
      state = base + done == 0 && first_replaces ? step_input : step_coeff * state + step_input;
      if (lane == done) mine = state;
      if (!is_finite(state)) {
        ++done;
        break;
      }
    }
    if (lane < done) store(n, mine);
    base += done;
  }
  // Past the first non-finite state: the sign recurrence, 32 steps a scan; a NaN state fills.
  while (base < length && state == state) {
    Acc coeff[Slices], input[Slices];
    #pragma unroll
    for (int j = 0; j < Slices; ++j) {
      const int64_t n = base + j * kLanes + lane;
      coeff[j] = Acc(1), input[j] = Acc(0);  // past the end: the identity
      if (n < length) load(n, coeff[j], input[j]);
    }
    #pragma unroll
    for (int j = 0; j < Slices; ++j) {
      const int64_t n = base + j * kLanes + lane;
      const Affine<Acc> map =
          segment_inclusive_scan<kLanes, false, false, Acc, false>(nonfinite_step(coeff[j], input[j]));
      const Acc result = map.coeff * state + map.value;
      if (n < length) store(n, result);
      state = __shfl_sync(kAll, result, kLanes - 1);
    }
    base += Slices * kLanes;
  }
  for (int64_t n = base + lane; n < length; n += kLanes) store(n, state);  // NaN
  return state;
}

// The forward's rescan of packed sequence `segment` of `row`: outputs in the op's direction.
template <RescanDepth Depth, bool LogCoeffs, typename T, typename C>
__device__ void rescan_forward(const ForwardParams& params, int64_t row, int64_t segment) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1), length = end - begin;
  const auto [input_at, coeff_at, output_at, initial_at] =
      params.shape.row_offsets(row, params.inputs, params.coeffs, params.outputs, params.initial).at;
  const T* const inputs = params.inputs.template row<const T>(input_at);
  const C* const coeffs = params.coeffs.template row<const C>(coeff_at);
  T* const outputs = params.outputs.template row<T>(output_at);
  const int64_t first = params.reverse ? end - 1 : begin, step = params.reverse ? -1 : 1;
  const auto time = [&](int64_t n) { return first + n * step; };
  const auto result = [&](int64_t n) { return static_cast<Acc>(outputs[time(n) * params.outputs.time_stride]); };
  const int64_t from = first_nonfinite<Depth.warp_slices>(length, result);
  if (from < 0) return;
  const bool has_initial = params.initial.data != nullptr;
  Acc state = Acc(0);
  if (from > 0) state = result(from - 1);
  else if (has_initial)
    state = static_cast<Acc>(params.initial.template row<const C>(initial_at)[segment * params.initial.segment_stride]);
  walk<Depth.warp_slices>(
      length, from, state, !has_initial,
      [&](int64_t n, Acc& coeff, Acc& input) {
        input = static_cast<Acc>(inputs[time(n) * params.inputs.time_stride]);
        coeff = coefficient(static_cast<Acc>(coeffs[time(n) * params.coeffs.time_stride]), LogCoeffs);
      },
      [&](int64_t n, Acc value) { outputs[time(n) * params.outputs.time_stride] = static_cast<T>(value); });
}

// The backward's rescan: d_inputs against the forward's direction (step n's coefficient is the
// conjugate of the one the forward applies after it; none for the forward's last step), then d_coeffs
// and d_initial from them, as sequential_scan_backward computes them.
template <RescanDepth Depth, bool LogCoeffs, typename T, typename C>
__device__ void rescan_backward(const BackwardParams& params, int64_t row, int64_t segment) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1), length = end - begin;
  const auto [d_output_at, coeff_at, output_at, d_input_at, d_coeff_at, initial_at, d_initial_at] =
      params.shape.row_offsets(row, params.d_outputs, params.coeffs, params.outputs, params.d_inputs,
                               params.d_coeffs, params.initial, params.d_initial).at;
  const T* const d_outputs = params.d_outputs.template row<const T>(d_output_at);
  const C* const coeffs = params.coeffs.template row<const C>(coeff_at);
  const T* const outputs = params.outputs.template row<const T>(output_at);
  T* const d_inputs = params.d_inputs.template row<T>(d_input_at);
  C* const d_coeffs = params.d_coeffs.template row<C>(d_coeff_at);
  const bool has_initial = params.initial.data != nullptr;
  const int64_t last = params.reverse ? begin : end - 1, step = params.reverse ? 1 : -1;
  const auto time = [&](int64_t n) { return last + n * step; };
  const auto coeff_at_step = [&](int64_t n) {
    return coefficient(static_cast<Acc>(coeffs[time(n) * params.coeffs.time_stride]), LogCoeffs);
  };
  const auto result = [&](int64_t n) { return static_cast<Acc>(d_inputs[time(n) * params.d_inputs.time_stride]); };
  const int64_t from = first_nonfinite<Depth.warp_slices>(length, result);
  if (from < 0) return;
  const Acc d_state = walk<Depth.warp_slices>(
      length, from, from > 0 ? result(from - 1) : Acc(0), false,
      [&](int64_t n, Acc& coeff, Acc& input) {
        input = static_cast<Acc>(d_outputs[time(n) * params.d_outputs.time_stride]);
        coeff = n == 0 ? Acc(0) : conj(coeff_at_step(n - 1));
      },
      [&](int64_t n, Acc d_state) {
        const int64_t t = time(n);
        d_inputs[t * params.d_inputs.time_stride] = static_cast<T>(d_state);
        if (params.sum_d_coeffs) return;  // added into by the parallel kernels alone
        const bool has_prev = n + 1 < length;
        Acc d_coeff = Acc(0);
        if (has_prev || has_initial) {
          const Acc prev = has_prev ? static_cast<Acc>(outputs[(t + step) * params.outputs.time_stride])
                                    : static_cast<Acc>(params.initial.template row<const C>(initial_at)[segment * params.initial.segment_stride]);
          d_coeff = d_state * conj(prev);
          if constexpr (LogCoeffs) d_coeff = d_coeff * coeff_at_step(n);
        }
        d_coeffs[t * params.d_coeffs.time_stride] = static_cast<C>(d_coeff);
      });
  if (has_initial && threadIdx.x % kLanes == 0) {
    params.d_initial.template row<C>(d_initial_at)[segment * params.d_initial.segment_stride] =
        static_cast<C>(conj(coeff_at_step(length - 1)) * d_state);
  }
}

}  // namespace warp_rescan

// A rescan by one lane a sequence: the loop itself, Depth.lane_steps steps' operands loaded before it
// multiplies through them (a lane waits on one load's latency per lane_steps steps). For sequences
// along strided time, whose neighbouring rows are neighbouring channels, the 32 lanes of a warp on 32
// rows read and write each step with one access, where a warp on one row (above) touches a sector per
// step and lane; but a lane walks its row lane_steps steps per load latency where a warp walks
// 32 x warp_slices, so a few flagged rows among 32 go a warp each (kFewRows). A NaN state fills the
// rest of a real sequence unread.
namespace lane_rescan {

// The first step, in walk order, of the `length` whose `value(n)` is not finite, or -1.
template <int Steps, typename Value>
__device__ __forceinline__ int64_t first_nonfinite(int64_t length, Value&& value) {
  for (int64_t base = 0; base < length; base += Steps) {
    bool nonfinite[Steps];
    #pragma unroll
    for (int j = 0; j < Steps; ++j) nonfinite[j] = base + j < length && !is_finite(value(base + j));
    #pragma unroll
    for (int j = 0; j < Steps; ++j)
      if (nonfinite[j]) return base + j;
  }
  return -1;
}

// Whether a state is NaN, so that every later result is (real types; a complex state with one NaN
// part takes a step to turn whole).
template <typename Acc>
__device__ __forceinline__ bool stays_nan(const Acc& state) {
  if constexpr (std::is_floating_point_v<Acc>) return state != state;
  else return false;
}

// Walks steps [from, length) of a sequence with state `state`: load(n, coeff, input) reads step n's
// coefficient and input in walk order (step 0's coefficient is not used where `first_replaces`),
// store(n, state) writes a result, fill(n, state) writes a result past a NaN state. Returns the last
// state.
template <int Steps, typename Acc, typename Load, typename Store, typename Fill>
__device__ __forceinline__ Acc walk(int64_t length, int64_t from, Acc state, bool first_replaces, Load&& load,
                                     Store&& store, Fill&& fill) {
  int64_t base = from;
  while (base < length) {
    Acc coeff[Steps], input[Steps];
    #pragma unroll
    for (int j = 0; j < Steps; ++j) {
      coeff[j] = Acc(1), input[j] = Acc(0);
      if (base + j < length) load(base + j, coeff[j], input[j]);
    }
    #pragma unroll
    for (int j = 0; j < Steps; ++j) {
      if (base + j >= length) break;
      state = base + j == 0 && first_replaces ? input[j] : coeff[j] * state + input[j];
      store(base + j, state);
    }
    base += Steps;
    if (stays_nan(state)) break;
  }
  for (; base < length; ++base) fill(base, state);
  return state;
}

// The forward's rescan of packed sequence `segment` of `row`: outputs in the op's direction.
template <RescanDepth Depth, bool LogCoeffs, typename T, typename C>
__device__ void rescan_forward(const ForwardParams& params, int64_t row, int64_t segment) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1), length = end - begin;
  const auto [input_at, coeff_at, output_at, initial_at] =
      params.shape.row_offsets(row, params.inputs, params.coeffs, params.outputs, params.initial).at;
  const T* const inputs = params.inputs.template row<const T>(input_at);
  const C* const coeffs = params.coeffs.template row<const C>(coeff_at);
  T* const outputs = params.outputs.template row<T>(output_at);
  const int64_t first = params.reverse ? end - 1 : begin, step = params.reverse ? -1 : 1;
  const auto time = [&](int64_t n) { return first + n * step; };
  const auto result = [&](int64_t n) { return static_cast<Acc>(outputs[time(n) * params.outputs.time_stride]); };
  const int64_t from = first_nonfinite<Depth.lane_steps>(length, result);
  if (from < 0) return;
  const bool has_initial = params.initial.data != nullptr;
  Acc state = Acc(0);
  if (from > 0) state = result(from - 1);
  else if (has_initial)
    state = static_cast<Acc>(params.initial.template row<const C>(initial_at)[segment * params.initial.segment_stride]);
  const auto store = [&](int64_t n, Acc value) { outputs[time(n) * params.outputs.time_stride] = static_cast<T>(value); };
  walk<Depth.lane_steps>(
      length, from, state, !has_initial,
      [&](int64_t n, Acc& coeff, Acc& input) {
        input = static_cast<Acc>(inputs[time(n) * params.inputs.time_stride]);
        coeff = coefficient(static_cast<Acc>(coeffs[time(n) * params.coeffs.time_stride]), LogCoeffs);
      },
      store, store);
}

// The backward's rescan, as warp_rescan::rescan_backward's: d_inputs against the forward's direction,
// d_coeffs and d_initial from them.
template <RescanDepth Depth, bool LogCoeffs, typename T, typename C>
__device__ void rescan_backward(const BackwardParams& params, int64_t row, int64_t segment) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1), length = end - begin;
  const auto [d_output_at, coeff_at, output_at, d_input_at, d_coeff_at, initial_at, d_initial_at] =
      params.shape.row_offsets(row, params.d_outputs, params.coeffs, params.outputs, params.d_inputs,
                               params.d_coeffs, params.initial, params.d_initial).at;
  const T* const d_outputs = params.d_outputs.template row<const T>(d_output_at);
  const C* const coeffs = params.coeffs.template row<const C>(coeff_at);
  const T* const outputs = params.outputs.template row<const T>(output_at);
  T* const d_inputs = params.d_inputs.template row<T>(d_input_at);
  C* const d_coeffs = params.d_coeffs.template row<C>(d_coeff_at);
  const bool has_initial = params.initial.data != nullptr;
  const int64_t last = params.reverse ? begin : end - 1, step = params.reverse ? 1 : -1;
  const auto time = [&](int64_t n) { return last + n * step; };
  const auto coeff_at_step = [&](int64_t n) {
    return coefficient(static_cast<Acc>(coeffs[time(n) * params.coeffs.time_stride]), LogCoeffs);
  };
  const auto result = [&](int64_t n) { return static_cast<Acc>(d_inputs[time(n) * params.d_inputs.time_stride]); };
  const int64_t from = first_nonfinite<Depth.lane_steps>(length, result);
  if (from < 0) return;
  const auto previous_output = [&](int64_t n) {  // the forward's state before step n, if it has one
    return n + 1 < length ? static_cast<Acc>(outputs[(time(n) + step) * params.outputs.time_stride])
                          : static_cast<Acc>(params.initial.template row<const C>(initial_at)[segment * params.initial.segment_stride]);
  };
  const bool sum_d_coeffs = params.sum_d_coeffs;  // added into by the parallel kernels alone
  const Acc d_state = walk<Depth.lane_steps>(
      length, from, from > 0 ? result(from - 1) : Acc(0), false,
      [&](int64_t n, Acc& coeff, Acc& input) {
        input = static_cast<Acc>(d_outputs[time(n) * params.d_outputs.time_stride]);
        coeff = n == 0 ? Acc(0) : conj(coeff_at_step(n - 1));
      },
      [&](int64_t n, Acc d_state) {
        const int64_t t = time(n);
        d_inputs[t * params.d_inputs.time_stride] = static_cast<T>(d_state);
        if (sum_d_coeffs) return;
        Acc d_coeff = Acc(0);
        if (n + 1 < length || has_initial) {
          d_coeff = d_state * conj(previous_output(n));
          if constexpr (LogCoeffs) d_coeff = d_coeff * coeff_at_step(n);
        }
        d_coeffs[t * params.d_coeffs.time_stride] = static_cast<C>(d_coeff);
      },
      [&](int64_t n, Acc nan) {  // NaN times anything is NaN: the operands need not be read
        const int64_t t = time(n);
        d_inputs[t * params.d_inputs.time_stride] = static_cast<T>(nan);
        if (!sum_d_coeffs) d_coeffs[t * params.d_coeffs.time_stride] = static_cast<C>(n + 1 < length || has_initial ? nan : Acc(0));
      });
  if (has_initial)
    params.d_initial.template row<C>(d_initial_at)[segment * params.d_initial.segment_stride] =
        static_cast<C>(conj(coeff_at_step(length - 1)) * d_state);
}

template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ void rescan_sequence(const Params& params, int64_t row, int64_t segment) {
  if constexpr (std::is_same_v<Params, ForwardParams>) {
    if (params.log_coeffs) rescan_forward<Depth, true, T, C>(params, row, segment);
    else rescan_forward<Depth, false, T, C>(params, row, segment);
  } else {
    if (params.log_coeffs) rescan_backward<Depth, true, T, C>(params, row, segment);
    else rescan_backward<Depth, false, T, C>(params, row, segment);
  }
}

// Rescans the rows first_row + s of the bits s of `flags` that hold a non-finite result, a lane each
// (every lane of the warp calls it with the same arguments). Channel pairs are rescanned channel by
// channel, in two rounds of 16 pairs.
template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ void rescan_rows(const Params& params, unsigned flags, int64_t first_row) {
  const int lane = threadIdx.x % warp_rescan::kLanes;
  if constexpr (is_channel_pair<T>::value) {
    using Scalar = decltype(T{}.first);
    using CoeffScalar = decltype(C{}.first);
    const Params scalar = unpaired(params);
    for (int round = 0; round < 2; ++round) {
      const int s = round * 16 + lane / 2;
      if ((flags >> s & 1u) && first_row + s < params.num_rows())
        for (int64_t segment = 0; segment < params.num_segments; ++segment)
          rescan_sequence<Depth, Scalar, CoeffScalar>(scalar, 2 * (first_row + s) + lane % 2, segment);
    }
  } else {
    if ((flags >> lane & 1u) && first_row + lane < params.num_rows())
      for (int64_t segment = 0; segment < params.num_segments; ++segment)
        rescan_sequence<Depth, T, C>(params, first_row + lane, segment);
  }
  __syncwarp();
}

// At most this many flagged rows of 32 neighbouring ones are rescanned a warp each rather than a lane
// each: a warp's walk is 32 x warp_slices / lane_steps times as fast along time, at a sector per lane
// and step.
constexpr int kFewRows = 4;

}  // namespace lane_rescan

// Whether the lanes of a warp rescan neighbouring rows (lane_rescan: time strided, where neighbouring
// rows are neighbouring channels) rather than one row together (warp_rescan: time contiguous).
template <typename Params>
__device__ __forceinline__ bool rescans_by_lane(const Params& params) {
  return rescanned(params).time_stride != 1;
}

// rescan_segment() by the 32 lanes of a warp (all of them call it): in parallel for real types (above),
// by the first lane for complex ones.
template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ void warp_rescan_segment(const Params& params, int64_t row, int64_t segment) {
  if constexpr (is_complex<accumulator_t<T>>::value) {
    if (threadIdx.x % warp_rescan::kLanes == 0) rescan_segment<T, C>(params, row, segment);
  } else if constexpr (std::is_same_v<Params, ForwardParams>) {
    if (params.log_coeffs) warp_rescan::rescan_forward<Depth, true, T, C>(params, row, segment);
    else warp_rescan::rescan_forward<Depth, false, T, C>(params, row, segment);
  } else {
    if (params.log_coeffs) warp_rescan::rescan_backward<Depth, true, T, C>(params, row, segment);
    else warp_rescan::rescan_backward<Depth, false, T, C>(params, row, segment);
  }
  __syncwarp();
}

// Rescans the packed sequences of row `row` of params over T and C (scalar types, or channel pairs of
// them) that hold a non-finite result, by the 32 lanes of a warp (all of them call it).
template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ __forceinline__ void rescan_nonfinite(const Params& params, int64_t row) {
  if constexpr (is_channel_pair<T>::value) {
    using Scalar = decltype(T{}.first);
    using CoeffScalar = decltype(C{}.first);
    const Params scalar = unpaired(params);
    for (int64_t segment = 0; segment < params.num_segments; ++segment) {
      warp_rescan_segment<Depth, Scalar, CoeffScalar>(scalar, 2 * row, segment);
      warp_rescan_segment<Depth, Scalar, CoeffScalar>(scalar, 2 * row + 1, segment);
    }
  } else {
    for (int64_t segment = 0; segment < params.num_segments; ++segment)
      warp_rescan_segment<Depth, T, C>(params, row, segment);
  }
}

// Rescans the rows first_row + s of the bits s of `flags`, 32 neighbouring rows along strided time,
// by one warp (every lane calls it): a warp a row where few are flagged, else a lane a row (lane_rescan).
template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ void rescan_neighbouring_rows(const Params& params, unsigned flags, int64_t first_row) {
  if (__popc(flags) > lane_rescan::kFewRows) {
    lane_rescan::rescan_rows<Depth, T, C>(params, flags, first_row);
    return;
  }
  for (; flags != 0; flags &= flags - 1) {
    const int64_t row = first_row + __ffs(flags) - 1;
    if (row < params.num_rows()) rescan_nonfinite<Depth, T, C>(params, row);
  }
}

// Rescans rows first_row + s of the sequences s < count with flagged[s] (in shared memory), a warp
// each, every warp of the block calling it. Not inlined, and called once at a kernel's end, so that
// the registers live across it are few; its own registers still count in the kernel's (RescanDepth).
// The kernels' params
// are __grid_constant__: passed by reference to a call, a plain kernel parameter would be copied to
// local memory by every thread at the kernel's start.
// StridedTime: whether the kernel's rows may run along strided time; where they cannot, the lane
// rescan's registers are not compiled in.
template <RescanDepth Depth, bool StridedTime, typename T, typename C, typename Params>
__device__ __noinline__ void rescan_flagged_rows(const Params& params, const bool* flagged, int count,
                                                 int64_t first_row) {
  const int warps = blockDim.x / warp_rescan::kLanes;
  if (StridedTime && rescans_by_lane(params)) {
    const int lane = threadIdx.x % warp_rescan::kLanes;
    for (int s = threadIdx.x / warp_rescan::kLanes * warp_rescan::kLanes; s < count; s += warps * warp_rescan::kLanes)
      rescan_neighbouring_rows<Depth, T, C>(
          params, __ballot_sync(warp_rescan::kAll, s + lane < count && flagged[s + lane]), first_row + s);
    return;
  }
  for (int s = threadIdx.x / warp_rescan::kLanes; s < count; s += warps)
    if (flagged[s] && first_row + s < params.num_rows()) rescan_nonfinite<Depth, T, C>(params, first_row + s);
}

// The same for the rows of a flags word (bit s: row first_row + s), a warp each.
template <RescanDepth Depth, typename T, typename C, typename Params>
__device__ __noinline__ void rescan_flagged_rows(const Params& params, unsigned flags, int64_t first_row) {
  const int warps = blockDim.x / warp_rescan::kLanes;
  if (rescans_by_lane(params)) {
    if (threadIdx.x < warp_rescan::kLanes) rescan_neighbouring_rows<Depth, T, C>(params, flags, first_row);
    return;
  }
  for (int s = threadIdx.x / warp_rescan::kLanes; s < 32; s += warps)
    if ((flags >> s & 1u) && first_row + s < params.num_rows()) rescan_nonfinite<Depth, T, C>(params, first_row + s);
}

#endif  // __CUDACC__

}  // namespace linrec
