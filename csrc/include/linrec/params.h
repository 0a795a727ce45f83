// Plain parameter structs handed from the op layer to every kernel launcher.
// Torch-free on purpose: the standalone executable (sanitizers, profilers) fills them too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LINREC_HOST_DEVICE __host__ __device__ __forceinline__
#define LINREC_NO_UNROLL _Pragma("unroll 1")
#define LINREC_UNROLL _Pragma("unroll")
#else
#define LINREC_HOST_DEVICE inline
#define LINREC_NO_UNROLL
#define LINREC_UNROLL
#endif

namespace linrec {

// The element types the kernels are compiled for.
enum class DType : int8_t { Float32, Float64, Float16, BFloat16, Complex64, Complex128 };

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
  }
  return "unknown";
}

inline bool is_complex_dtype(DType dtype) { return dtype == DType::Complex64 || dtype == DType::Complex128; }

// The op layer merges the dims other than time into at most this many "batch" dims (dropping size-1
// dims and fusing dims that every operand steps through evenly); tensors needing more are refused.
constexpr int kMaxBatchDims = 8;

// A batch row's first elements (time index 0) in N operands.
template <typename T, int N>
struct RowPointers {
  T* at[N];
};

// A batch row's first elements in N operands, in elements from each operand's data pointer: for
// operands of different element types (BatchShape::row_offsets, Operand::row).
template <int N>
struct RowOffsets {
  int64_t at[N];
};

// The batch dims the sequences are numbered over, outermost first: sequence row r has the
// multi-index of r in sizes[0..num_dims) (row-major, the last dim fastest). Built by of(), which
// keeps `rows` the product of the sizes.
struct BatchShape {
  int num_dims = 0;
  int64_t sizes[kMaxBatchDims] = {};
  int64_t rows = 1;  // kept, not recomputed: the kernels ask for it in many places

  static BatchShape of(const int64_t* dim_sizes, int count) {
    BatchShape shape;
    shape.num_dims = count;
    for (int d = 0; d < count; ++d) {
      shape.sizes[d] = dim_sizes[d];
      shape.rows *= dim_sizes[d];
    }
    return shape;
  }

  LINREC_HOST_DEVICE int64_t num_rows() const { return rows; }

  // Where row `row` begins in each of `operands`, in elements from its data pointer. One walk over the
  // batch dims serves all operands, since the divisions are the costly part (a kernel over short
  // sequences spends a noticeable share of its time here): the outermost dim needs none, so the common
  // single batch dim costs nothing, and the others divide in 32 bits where that is exact. The walk is a
  // loop, not unrolled over kMaxBatchDims: every kernel instantiation carries this code, and unrolled it
  // was the largest part of them.
  template <typename... Operands>
  LINREC_HOST_DEVICE RowOffsets<sizeof...(Operands)> row_offsets(int64_t row, const Operands&... operands) const {
    constexpr int kCount = sizeof...(Operands);
    RowOffsets<kCount> offsets{};
    LINREC_NO_UNROLL
    for (int d = num_dims - 1; d >= 1; --d) {
      int64_t index;
      if ((static_cast<uint64_t>(row) | static_cast<uint64_t>(sizes[d])) >> 32 == 0) {
        const uint32_t row32 = static_cast<uint32_t>(row), size32 = static_cast<uint32_t>(sizes[d]);
        index = row32 % size32;
        row = row32 / size32;
      } else {
        index = row % sizes[d];
        row /= sizes[d];
      }
      int k = 0;
      ((offsets.at[k++] += index * operands.strides[d]), ...);
    }
    int k = 0;
    ((offsets.at[k++] += row * operands.strides[0]), ...);
    return offsets;
  }

  // Where row `row` begins in each of `operands`, all of element type T.
  template <typename T, typename... Operands>
  LINREC_HOST_DEVICE RowPointers<T, sizeof...(Operands)> row_pointers(int64_t row, const Operands&... operands) const {
    const RowOffsets<sizeof...(Operands)> offsets = row_offsets(row, operands...);
    RowPointers<T, sizeof...(Operands)> result;
    int k = 0;
    ((result.at[k] = static_cast<T*>(operands.data) + offsets.at[k], ++k), ...);
    return result;
  }
};

// One tensor operand as the kernels address it: element (row, t) lives at
// data[offset(row) + t * time_stride], with strides in elements. Broadcast dims have stride 0.
struct Operand {
  void* data = nullptr;
  int64_t time_stride = 0;
  int64_t segment_stride = 0;  // between packed sequences' initial states (cu_seqlens), else 0
  int64_t strides[kMaxBatchDims] = {};  // 0 past the shape's num_dims

  // The row `offset` elements (BatchShape::row_offsets) into the data, as elements of type T.
  template <typename T>
  LINREC_HOST_DEVICE T* row(int64_t offset) const { return static_cast<T*>(data) + offset; }
};

// The sequences one op call scans: num_segments x shape.num_rows() of them. Without cu_seqlens, one
// segment spans all seq_len time steps; with it, packed sequence s spans [cu_seqlens[s], cu_seqlens[s+1]).
struct SequenceLayout {
  BatchShape shape;
  int64_t seq_len = 0;           // time steps per row (all packed sequences together)
  int64_t num_segments = 1;      // packed sequences per row
  const void* cu_seqlens = nullptr;  // num_segments + 1 offsets, int32 or int64; null: one segment
  bool cu_seqlens_int64 = false;
  bool reverse = false;     // scan from the last element towards the first
  bool log_coeffs = false;  // coeffs hold log c: the kernels use exp(coeffs)
  DType dtype = DType::Float32;
  // The dtype of coeffs and initial, and of their gradients: dtype, or float32 where dtype is float16
  // or bfloat16 (mixed precision: decays keep float32's resolution near 1, which 16-bit types lack).
  DType coeff_dtype = DType::Float32;
  // CUDA kernel config forced for experiments and tuning; 0 and 0 let the launcher choose per shape.
  int threads_per_sequence = 0;
  int vectors_per_thread = 0;
  // Scratch memory of the CUDA kernels that split sequences across blocks (chained scans), zeroed:
  // the op layer allocates the bytes the call's plan asks for (Plan::workspace_bytes); null when it asks for none.
  void* workspace = nullptr;

  LINREC_HOST_DEVICE int64_t num_rows() const { return shape.num_rows(); }
  LINREC_HOST_DEVICE int64_t numel() const { return num_rows() * seq_len; }

  // Where packed sequence `segment` begins (and segment - 1 ends) along time. Clamped into
  // [0, seq_len]: offsets that were not checked (CUDA ones under torch.compile) cannot send a kernel
  // outside the tensors.
  LINREC_HOST_DEVICE int64_t boundary(int64_t segment) const {
    if (cu_seqlens == nullptr) return segment == 0 ? 0 : seq_len;
    const int64_t value = cu_seqlens_int64 ? static_cast<const int64_t*>(cu_seqlens)[segment]
                                           : static_cast<const int32_t*>(cu_seqlens)[segment];
    return value < 0 ? 0 : value > seq_len ? seq_len : value;
  }
};

// Per sequence: outputs[first] = coeffs[first] * initial + inputs[first] (initial = 0 when absent),
// then outputs[l] = coeffs[l] * outputs[l-1] + inputs[l], with "first" and "l-1" in scan order.
struct ForwardParams : SequenceLayout {
  Operand inputs, coeffs, outputs;
  Operand initial;  // data == nullptr: no initial state
};

// Gradient of the forward recurrence, in one pass against the scan direction (PyTorch's convention
// for complex numbers, conj = conjugate, identity for real types):
//   d_inputs[l] = conj(coeffs[l+1]) * d_inputs[l+1] + d_outputs[l]
//   d_coeffs[l] = d_inputs[l] * conj(outputs[l-1])     (outputs[first-1] = initial, or 0)
//   d_initial   = conj(coeffs[first]) * d_inputs[first]
// With log_coeffs, d_coeffs is with respect to log c: the above times c[l].
// Where coeffs are broadcast (sum_d_coeffs), d_coeffs has coeffs' shape: its operand has coeffs' strides
// (0 along the broadcast dims, time included), its data is a zeroed buffer of the accumulator type
// (float for the 16-bit types), and the kernels add each element's d_coeffs[l] into it.
struct BackwardParams : SequenceLayout {
  Operand d_outputs, coeffs, outputs, initial;
  Operand d_inputs, d_coeffs;
  Operand d_initial;  // data == nullptr when there is no initial state
  bool sum_d_coeffs = false;
};

}  // namespace linrec
