// The recurrence run element after element: the CPU kernel, and the host reference of the
// standalone CUDA kernel check. accumulator_t is shared with the CUDA kernels.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define LINREC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LINREC_HOST_DEVICE inline
#endif

namespace linrec {

// 16-bit element types are loaded into float and accumulated there; the rest accumulate as they are.
template <typename T>
using accumulator_t = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;

// Lanes sequences, row_stride elements apart, run in lockstep: their recurrences are independent,
// so interleaving them hides the latency of each step's multiply-add (the CPU kernel's inner loop).
template <int Lanes = 1, typename T>
LINREC_HOST_DEVICE void sequential_scan_forward(const T* inputs, const T* coeffs, T* outputs, int64_t seq_len,
                                                bool reverse, int64_t row_stride = 0) {
  using Acc = accumulator_t<T>;
  const int64_t step = reverse ? -1 : 1;
  int64_t l = reverse ? seq_len - 1 : 0;
  Acc state[Lanes];
  for (int64_t n = 0; n < seq_len; ++n, l += step) {
    for (int k = 0; k < Lanes; ++k) {
      const int64_t i = k * row_stride + l;
      // The first element has no predecessor: outputs = inputs there, and its coefficient takes no
      // part (so a NaN or Inf in it does not reach the outputs).
      state[k] = n == 0 ? static_cast<Acc>(inputs[i])
                        : static_cast<Acc>(coeffs[i]) * state[k] + static_cast<Acc>(inputs[i]);
      outputs[i] = static_cast<T>(state[k]);
    }
  }
}

template <int Lanes = 1, typename T>
LINREC_HOST_DEVICE void sequential_scan_backward(const T* d_outputs, const T* coeffs, const T* outputs,
                                                 T* d_inputs, T* d_coeffs, int64_t seq_len, bool reverse,
                                                 int64_t row_stride = 0) {
  using Acc = accumulator_t<T>;
  // Walk against the forward scan: from its last element towards its first.
  const int64_t step = reverse ? 1 : -1;
  int64_t l = reverse ? 0 : seq_len - 1;
  Acc d_state[Lanes];
  Acc next_coeff[Lanes];  // coeffs shifted by one step; nothing follows the last element
  for (int k = 0; k < Lanes; ++k) d_state[k] = next_coeff[k] = Acc(0);
  for (int64_t n = 0; n < seq_len; ++n, l += step) {
    const bool has_prev = n + 1 < seq_len;  // the forward scan's first element has none
    for (int k = 0; k < Lanes; ++k) {
      const int64_t i = k * row_stride + l;
      d_state[k] = next_coeff[k] * d_state[k] + static_cast<Acc>(d_outputs[i]);
      next_coeff[k] = static_cast<Acc>(coeffs[i]);
      d_inputs[i] = static_cast<T>(d_state[k]);
      d_coeffs[i] = static_cast<T>(has_prev ? d_state[k] * static_cast<Acc>(outputs[i + step]) : Acc(0));
    }
  }
}

}  // namespace linrec
