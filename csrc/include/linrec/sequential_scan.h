// The recurrence run element after element over strided operands: the CPU kernel for layouts the
// vector kernels do not take (and complex types), the rescan of sequences whose parallel results hold
// a non-finite value (the CUDA kernels' complex types: nonfinite_rescan.h), and the host reference of
// the standalone CUDA kernel check. Every feature of the params (strides, broadcasting, initial
// state, packed sequences, log coefficients, complex types) is handled here in its plainest form, with
// the loop's IEEE semantics: each step multiplies the state by its coefficient.
#pragma once

#include <cstdint>

#include "linrec/numeric.h"
#include "linrec/params.h"

namespace linrec {

// Whether a scan of one sequence of T on the host may stop at its first NaN state and fill the rest:
// a NaN state stays NaN at every later step (c * NaN + x is NaN), forward and backward, so the loop
// need not run on. Real types only (a complex state with one NaN part takes a step to turn whole),
// and on the host only (the CPU sequential family's single rows; the CPU rows family rescans with
// vectors: cpu/row_rescan.h).
template <int Lanes, typename T>
LINREC_HOST_DEVICE constexpr bool stops_at_nan() {
#if defined(__CUDA_ARCH__)
  return false;
#else
  return Lanes == 1 && !is_complex<accumulator_t<T>>::value;
#endif
}

// Scans packed sequence `segment` of Lanes batch rows in lockstep: their recurrences are independent,
// so interleaving them hides the latency of each step's multiply-add (the CPU kernel's inner loop).
// LogCoeffs is a template argument so that the loop neither branches on it nor calls exp per element
// when it is off (a runtime test there made the CPU kernel 4x slower). C is the element type of coeffs
// and initial (and of their gradients): T, or float for 16-bit T.
template <bool LogCoeffs, int Lanes, typename T, typename C>
LINREC_HOST_DEVICE void sequential_scan_forward_impl(const ForwardParams& params, const int64_t (&rows)[Lanes],
                                                     int64_t segment, int64_t from_step) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1);
  const bool has_initial = params.initial.data != nullptr;
  const T* inputs[Lanes];
  const C* coeffs[Lanes];
  T* outputs[Lanes];
  Acc state[Lanes];
  for (int k = 0; k < Lanes; ++k) {
    const auto [input_at, coeff_at, output_at, initial_at] =
        params.shape.row_offsets(rows[k], params.inputs, params.coeffs, params.outputs, params.initial).at;
    inputs[k] = params.inputs.template row<const T>(input_at);
    coeffs[k] = params.coeffs.template row<const C>(coeff_at);
    outputs[k] = params.outputs.template row<T>(output_at);
    state[k] = has_initial ? static_cast<Acc>(params.initial.template row<const C>(initial_at)[segment * params.initial.segment_stride])
                           : Acc(0);
  }
  const int64_t step = params.reverse ? -1 : 1;
  const int64_t first = params.reverse ? end - 1 : begin;
  for (int64_t n = 0, t = first; n < end - begin; ++n, t += step) {
    for (int k = 0; k < Lanes; ++k) {
      const Acc input = static_cast<Acc>(inputs[k][t * params.inputs.time_stride]);
      const Acc coeff = coefficient(static_cast<Acc>(coeffs[k][t * params.coeffs.time_stride]), LogCoeffs);
      // Without an initial state the first coefficient takes no part (a NaN or Inf in it does not
      // reach the outputs).
      state[k] = n == 0 && !has_initial ? input : coeff * state[k] + input;
      if (n >= from_step) outputs[k][t * params.outputs.time_stride] = static_cast<T>(state[k]);
    }
    if constexpr (stops_at_nan<Lanes, T>()) {
      if (state[0] != state[0]) {  // every later output is NaN: an all-NaN row costs a fill
        const T nan = static_cast<T>(state[0]);
        for (int64_t rest = n + 1 > from_step ? n + 1 : from_step, u = first + rest * step; rest < end - begin;
             ++rest, u += step)
          outputs[0][u * params.outputs.time_stride] = nan;
        return;
      }
    }
  }
}

template <bool LogCoeffs, int Lanes, typename T, typename C>
LINREC_HOST_DEVICE void sequential_scan_backward_impl(const BackwardParams& params, const int64_t (&rows)[Lanes],
                                                      int64_t segment, int64_t from_step) {
  using Acc = accumulator_t<T>;
  const int64_t begin = params.boundary(segment), end = params.boundary(segment + 1);
  const bool has_initial = params.initial.data != nullptr;
  const T* d_outputs[Lanes];
  const C* coeffs[Lanes];
  const T* outputs[Lanes];
  T* d_inputs[Lanes];
  C* d_coeffs[Lanes];
  const C* initial[Lanes];  // this packed sequence's initial state, if any
  C* d_initial[Lanes];
  Acc d_state[Lanes];
  Acc next_coeff[Lanes];  // conj(coeffs) one step later in the forward scan; nothing follows the last
  for (int k = 0; k < Lanes; ++k) {
    const auto [d_output_at, coeff_at, output_at, d_input_at, d_coeff_at, initial_at, d_initial_at] =
        params.shape.row_offsets(rows[k], params.d_outputs, params.coeffs, params.outputs, params.d_inputs,
                                 params.d_coeffs, params.initial, params.d_initial).at;
    d_outputs[k] = params.d_outputs.template row<const T>(d_output_at);
    coeffs[k] = params.coeffs.template row<const C>(coeff_at);
    outputs[k] = params.outputs.template row<const T>(output_at);
    d_inputs[k] = params.d_inputs.template row<T>(d_input_at);
    d_coeffs[k] = params.d_coeffs.template row<C>(d_coeff_at);
    initial[k] = has_initial ? params.initial.template row<const C>(initial_at) + segment * params.initial.segment_stride : nullptr;
    d_initial[k] = has_initial ? params.d_initial.template row<C>(d_initial_at) + segment * params.d_initial.segment_stride : nullptr;
    d_state[k] = next_coeff[k] = Acc(0);
  }
  // Walk against the forward scan: from its last element towards its first.
  const int64_t step = params.reverse ? 1 : -1;
  const int64_t last = params.reverse ? begin : end - 1;
  const int64_t length = end - begin;
  for (int64_t n = 0, t = last; n < length; ++n, t += step) {
    const bool has_prev = n + 1 < length;  // the forward scan's first element has none
    for (int k = 0; k < Lanes; ++k) {
      d_state[k] = next_coeff[k] * d_state[k] + static_cast<Acc>(d_outputs[k][t * params.d_outputs.time_stride]);
      const Acc coeff = coefficient(static_cast<Acc>(coeffs[k][t * params.coeffs.time_stride]), LogCoeffs);
      next_coeff[k] = conj(coeff);
      if (n < from_step) continue;
      d_inputs[k][t * params.d_inputs.time_stride] = static_cast<T>(d_state[k]);
      Acc d_coeff = Acc(0);
      if (has_prev || has_initial) {
        const Acc prev = has_prev ? static_cast<Acc>(outputs[k][(t + step) * params.outputs.time_stride])
                                  : static_cast<Acc>(*initial[k]);
        d_coeff = d_state[k] * conj(prev);
        if constexpr (LogCoeffs) d_coeff = d_coeff * coeff;  // d/d(log c) = c * d/dc
      }
      // A summed d_coeffs (the CUDA kernels' broadcast coefficients) is added into by the parallel
      // kernels alone: a rescan leaves it as they left it.
      if (!params.sum_d_coeffs) d_coeffs[k][t * params.d_coeffs.time_stride] = static_cast<C>(d_coeff);
    }
    if constexpr (stops_at_nan<Lanes, T>()) {
      // Every later gradient is NaN, but the forward's first step's d_coeffs without an initial state
      // (0), and d_initial is NaN.
      if (d_state[0] != d_state[0] && n + 1 < length) {
        const T nan = static_cast<T>(d_state[0]);
        for (int64_t rest = n + 1 > from_step ? n + 1 : from_step, u = last + rest * step; rest < length;
             ++rest, u += step) {
          d_inputs[0][u * params.d_inputs.time_stride] = nan;
          const bool gradient = rest + 1 < length || has_initial;
          if (!params.sum_d_coeffs)
            d_coeffs[0][u * params.d_coeffs.time_stride] = static_cast<C>(gradient ? d_state[0] : Acc(0));
        }
        if (has_initial) *d_initial[0] = static_cast<C>(d_state[0]);
        return;
      }
    }
  }
  if (has_initial)
    for (int k = 0; k < Lanes; ++k)
      *d_initial[k] = static_cast<C>(length > 0 ? next_coeff[k] * d_state[k] : Acc(0));
}

// Scans packed sequence `segment` of `rows`, storing the results of its steps from `from_step` on (in
// scan order from the sequence's first): a rescan keeps the parallel results before the first
// non-finite one (nonfinite_rescan.h).
template <int Lanes, typename T, typename C = T>
LINREC_HOST_DEVICE void sequential_scan_forward(const ForwardParams& params, const int64_t (&rows)[Lanes],
                                                int64_t segment, int64_t from_step = 0) {
  if (params.log_coeffs) sequential_scan_forward_impl<true, Lanes, T, C>(params, rows, segment, from_step);
  else sequential_scan_forward_impl<false, Lanes, T, C>(params, rows, segment, from_step);
}

template <int Lanes, typename T, typename C = T>
LINREC_HOST_DEVICE void sequential_scan_backward(const BackwardParams& params, const int64_t (&rows)[Lanes],
                                                 int64_t segment, int64_t from_step = 0) {
  if (params.log_coeffs) sequential_scan_backward_impl<true, Lanes, T, C>(params, rows, segment, from_step);
  else sequential_scan_backward_impl<false, Lanes, T, C>(params, rows, segment, from_step);
}

}  // namespace linrec
