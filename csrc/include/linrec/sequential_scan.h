// The recurrence over one sequence, one element after the other. Shared by the CPU kernel and
// the one-thread-per-sequence CUDA kernel, and the ground truth the parallel kernels build on.
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

template <typename T>
LINREC_HOST_DEVICE void sequential_scan_forward(const T* inputs, const T* coeffs, T* outputs,
                                                int64_t seq_len, bool reverse) {
  using Acc = accumulator_t<T>;
  const int64_t step = reverse ? -1 : 1;
  int64_t l = reverse ? seq_len - 1 : 0;
  Acc state = Acc(0);
  for (int64_t n = 0; n < seq_len; ++n, l += step) {
    // The first element has no predecessor: outputs = inputs there, and its coefficient takes no
    // part (so a NaN or Inf in it does not reach the outputs).
    state = n == 0 ? static_cast<Acc>(inputs[l]) : static_cast<Acc>(coeffs[l]) * state + static_cast<Acc>(inputs[l]);
    outputs[l] = static_cast<T>(state);
  }
}

template <typename T>
LINREC_HOST_DEVICE void sequential_scan_backward(const T* d_outputs, const T* coeffs, const T* outputs,
                                                 T* d_inputs, T* d_coeffs, int64_t seq_len,
                                                 bool reverse) {
  using Acc = accumulator_t<T>;
  // Walk against the forward scan: from its last element towards its first.
  const int64_t step = reverse ? 1 : -1;
  int64_t l = reverse ? 0 : seq_len - 1;
  Acc d_state = Acc(0);
  Acc next_coeff = Acc(0);  // coeffs shifted by one step; nothing follows the last element
  for (int64_t n = 0; n < seq_len; ++n, l += step) {
    d_state = next_coeff * d_state + static_cast<Acc>(d_outputs[l]);
    next_coeff = static_cast<Acc>(coeffs[l]);
    const bool has_prev = n + 1 < seq_len;  // the forward scan's first element has none
    d_inputs[l] = static_cast<T>(d_state);
    d_coeffs[l] = static_cast<T>(has_prev ? d_state * static_cast<Acc>(outputs[l + step]) : Acc(0));
  }
}

}  // namespace linrec
