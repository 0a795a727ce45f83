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

// Whether every item is finite.
template <typename Acc, int Items>
__device__ __forceinline__ bool all_finite(const Acc (&items)[Items]) {
  bool finite = true;
  #pragma unroll
  for (int i = 0; i < Items; ++i) finite = finite && is_finite(items[i]);
  return finite;
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

// Rescans the packed sequences of row `row` of params over T and C (scalar types, or channel pairs of them)
// that hold a non-finite result. Not inlined, so that its registers are not the kernels'. The kernels'
// params are __grid_constant__: passed by reference to a call, a plain kernel parameter would be
// copied to local memory by every thread at the kernel's start.
template <typename T, typename C, typename Params>
__device__ __noinline__ void rescan_nonfinite(const Params& params, int64_t row) {
  if constexpr (is_channel_pair<T>::value) {
    using Scalar = decltype(T{}.first);
    using CoeffScalar = decltype(C{}.first);
    const Params scalar = unpaired(params);
    for (int64_t segment = 0; segment < params.num_segments; ++segment) {
      rescan_segment<Scalar, CoeffScalar>(scalar, 2 * row, segment);
      rescan_segment<Scalar, CoeffScalar>(scalar, 2 * row + 1, segment);
    }
  } else {
    for (int64_t segment = 0; segment < params.num_segments; ++segment) rescan_segment<T, C>(params, row, segment);
  }
}

#endif  // __CUDACC__

}  // namespace linrec
