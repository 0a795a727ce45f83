// Plain parameter structs handed from the op layer to every kernel launcher.
// Torch-free on purpose: the standalone executable (sanitizers, profilers) fills them too.
#pragma once

#include <cstdint>

namespace linrec {

// The floating-point element types the kernels are compiled for.
enum class DType : int8_t { Float32, Float64, Float16, BFloat16 };

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
  }
  return "unknown";
}

// num_sequences independent rows of seq_len contiguous elements each.
struct SequenceLayout {
  int64_t num_sequences = 0;
  int64_t seq_len = 0;
  bool reverse = false;  // scan from the last element towards the first
  DType dtype = DType::Float32;
  // CUDA kernel config forced for experiments and tuning; 0 and 0 let the launcher choose per shape.
  int threads_per_sequence = 0;
  int vectors_per_thread = 0;

  int64_t numel() const { return num_sequences * seq_len; }
};

// outputs[0] = inputs[0]; outputs[l] = coeffs[l] * outputs[l-1] + inputs[l] for l >= 1.
struct ForwardParams : SequenceLayout {
  const void* inputs = nullptr;
  const void* coeffs = nullptr;
  void* outputs = nullptr;
};

// Gradient of the forward recurrence, in one pass:
//   d_inputs[l] = coeffs[l+1] * d_inputs[l+1] + d_outputs[l]   (a scan against the forward direction)
//   d_coeffs[l] = d_inputs[l] * outputs[l-1]                     (d_coeffs[0] = 0)
// with l+1 and l-1 taken in the forward scan's direction.
struct BackwardParams : SequenceLayout {
  const void* d_outputs = nullptr;
  const void* coeffs = nullptr;
  const void* outputs = nullptr;
  void* d_inputs = nullptr;
  void* d_coeffs = nullptr;
};

}  // namespace linrec
