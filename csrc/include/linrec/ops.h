// The op bodies shared by every device: argument checks, output allocation and the translation
// from stable-ABI tensors (any strides, broadcast coefficients, optional initial state and packed
// sequences) to the plain params structs. Each device's file instantiates them with its own launcher
// and registers the result in its STABLE_TORCH_LIBRARY_IMPL block.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "linrec/check.h"
#include "linrec/params.h"

// Hidden like torch::stable itself, whose Tensor these types hold.
namespace linrec __attribute__((visibility("hidden"))) {

using torch::stable::Tensor;
using OptionalTensor = std::optional<Tensor>;

inline std::string shape_string(const Tensor& tensor) {
  std::string text = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.size(d));
  return text + "]";
}

inline std::string shape_string(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + "]";
}

inline std::string device_string(const Tensor& tensor) {
  if (tensor.is_cpu()) return "cpu";
  const std::string type = tensor.is_cuda() ? "cuda" : "device type " + std::to_string(static_cast<int>(tensor.device().type()));
  return type + ":" + std::to_string(tensor.get_device_index());
}

// The dtype as Python prints it (torch.float32, not Float).
inline std::string dtype_string(torch::headeronly::ScalarType dtype) {
  using torch::headeronly::ScalarType;
  switch (dtype) {
    case ScalarType::Bool: return "torch.bool";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::ComplexHalf: return "torch.complex32";
    case ScalarType::ComplexFloat: return "torch.complex64";
    case ScalarType::ComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + torch::headeronly::toString(dtype);
  }
}

inline std::string dtype_string(const Tensor& tensor) { return dtype_string(tensor.scalar_type()); }

inline std::vector<int64_t> sizes_of(const Tensor& tensor) {
  std::vector<int64_t> sizes(tensor.dim());
  for (int64_t d = 0; d < tensor.dim(); ++d) sizes[d] = tensor.size(d);
  return sizes;
}

inline DType to_dtype(const Tensor& tensor, const char* op, const char* name) {
  using torch::headeronly::ScalarType;
  switch (tensor.scalar_type()) {
    case ScalarType::Float: return DType::Float32;
    case ScalarType::Double: return DType::Float64;
    case ScalarType::Half: return DType::Float16;
    case ScalarType::BFloat16: return DType::BFloat16;
    case ScalarType::ComplexFloat: return DType::Complex64;
    case ScalarType::ComplexDouble: return DType::Complex128;
    default: break;
  }
  LINREC_CHECK_TYPE(false, op, ": ", name, " must be torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64 or torch.complex128, got ",
                   dtype_string(tensor));
  return DType::Float32;
}

// `tensor` must be on the device of `like` and have its dtype.
inline void check_like(const char* op, const char* name, const Tensor& tensor, const char* like_name, const Tensor& like) {
  LINREC_CHECK(tensor.device() == like.device(), op, ": ", name, " must be on the device of ", like_name, " (",
               device_string(like), "), got ", device_string(tensor));
  LINREC_CHECK_TYPE(tensor.scalar_type() == like.scalar_type(), op, ": ", name, " must have the dtype of ", like_name,
                    " (", dtype_string(like), "), got ", dtype_string(tensor));
}

inline bool is_16_bit(const Tensor& tensor) {
  using torch::headeronly::ScalarType;
  return tensor.scalar_type() == ScalarType::Half || tensor.scalar_type() == ScalarType::BFloat16;
}

// coeffs and initial: on the device of `values`, of its dtype or, where it is 16-bit, float32.
inline void check_coeff_like(const char* op, const char* name, const Tensor& tensor, const char* values_name,
                             const Tensor& values) {
  if (!is_16_bit(values)) {
    check_like(op, name, tensor, values_name, values);
    return;
  }
  LINREC_CHECK(tensor.device() == values.device(), op, ": ", name, " must be on the device of ", values_name, " (",
               device_string(values), "), got ", device_string(tensor));
  LINREC_CHECK_TYPE(tensor.scalar_type() == values.scalar_type() ||
                        tensor.scalar_type() == torch::headeronly::ScalarType::Float,
                    op, ": ", name, " must have the dtype of ", values_name, " (", dtype_string(values),
                    ") or torch.float32, got ", dtype_string(tensor));
}

// `tensor` as `dtype`: itself where it has it, else a converted copy (exact: 16-bit to float32 only).
inline Tensor converted(const Tensor& tensor, torch::headeronly::ScalarType dtype) {
  return tensor.scalar_type() == dtype ? tensor : torch::stable::to(tensor, dtype);
}

inline OptionalTensor converted(const OptionalTensor& tensor, torch::headeronly::ScalarType dtype) {
  return tensor ? OptionalTensor(converted(*tensor, dtype)) : std::nullopt;
}

inline void check_shape(const char* op, const char* name, const Tensor& tensor, const std::vector<int64_t>& expected,
                        const char* what) {
  LINREC_CHECK(sizes_of(tensor) == expected, op, ": ", name, " must have shape ", shape_string(expected), " (", what,
               "), got ", shape_string(tensor));
}

// The arguments both ops share, checked, with the time dim normalized.
struct Arguments {
  int64_t time_dim = 0;
  std::vector<int64_t> sizes;          // of inputs (d_outputs in the backward)
  std::vector<int64_t> initial_sizes;  // what initial must be: sizes without time, dim 0 counting packed sequences
  DType dtype = DType::Float32;
  // Mixed precision: inputs are 16-bit and coeffs or initial float32. The kernels then read both in
  // float32 (SequenceLayout::coeff_dtype), the other one converted, exactly; else in inputs' dtype.
  bool mixed = false;

  torch::headeronly::ScalarType coeff_type(const Tensor& values) const {
    return mixed ? torch::headeronly::ScalarType::Float : values.scalar_type();
  }
};

// cu_seqlens for `values` packed along a time dim of `length` steps: a contiguous 1-dim int32 or int64
// tensor of at least 2 offsets on values' device. CPU offsets are checked to run from 0 to `length`
// without decreasing; CUDA ones are checked once per tensor by the Python API (a copy to the host,
// which an op cannot afford on every call), and the kernels clamp them to the time dim.
inline void check_cu_seqlens(const char* op, const char* values_name, const Tensor& values, const Tensor& offsets,
                             int64_t length) {
  LINREC_CHECK(offsets.dim() == 1 && offsets.size(0) >= 2, op,
               ": cu_seqlens must be a 1-dim tensor of at least 2 offsets, got shape ", shape_string(offsets));
  LINREC_CHECK_TYPE(offsets.scalar_type() == torch::headeronly::ScalarType::Int ||
                        offsets.scalar_type() == torch::headeronly::ScalarType::Long,
                    op, ": cu_seqlens must be torch.int32 or torch.int64, got ", dtype_string(offsets));
  LINREC_CHECK(offsets.device() == values.device(), op, ": cu_seqlens must be on the device of ", values_name, " (",
               device_string(values), "), got ", device_string(offsets));
  // The kernels read the offsets as a plain array.
  LINREC_CHECK(offsets.is_contiguous(), op, ": cu_seqlens must be contiguous, got stride ", offsets.stride(0));
  if (!offsets.is_cpu()) return;
  // Read through one pointer: each accessor of a stable-ABI tensor is a call into libtorch, which inside the
  // loop took about 15 ns an offset, most of a call over thousands of short sequences.
  const bool is_int64 = offsets.scalar_type() == torch::headeronly::ScalarType::Long;
  const void* data = offsets.const_data_ptr();
  const int64_t count = offsets.size(0);
  int64_t previous = 0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t value = is_int64 ? static_cast<const int64_t*>(data)[s] : static_cast<const int32_t*>(data)[s];
    LINREC_CHECK(s > 0 || value == 0, op, ": cu_seqlens must start at 0, got ", value);
    LINREC_CHECK(value >= previous, op, ": cu_seqlens must be non-decreasing, got ", previous, " then ", value,
                 " at index ", s);
    previous = value;
  }
  LINREC_CHECK(previous == length, op, ": cu_seqlens must end at the length of the time dim (", length, "), got ",
               previous);
}

// Checks `values` (inputs or d_outputs), coeffs, dim, initial, cu_seqlens and log_coeffs together.
inline Arguments check_arguments(const char* op, const char* values_name, const Tensor& values, const Tensor& coeffs,
                                 int64_t dim, const OptionalTensor& initial, const OptionalTensor& cu_seqlens,
                                 bool log_coeffs) {
  Arguments args;
  LINREC_CHECK(values.dim() >= 1, op, ": ", values_name, " must have at least one dim (the time dim), got a 0-dim tensor");
  args.dtype = to_dtype(values, op, values_name);
  args.sizes = sizes_of(values);
  const int64_t ndim = values.dim();
  LINREC_CHECK_INDEX(dim >= -ndim && dim < ndim, op, ": dim must be in [", -ndim, ", ", ndim - 1, "] for a ", ndim,
                     "-dim tensor, got ", dim);
  args.time_dim = dim < 0 ? dim + ndim : dim;

  check_coeff_like(op, "coeffs", coeffs, values_name, values);
  bool broadcastable = coeffs.dim() <= ndim;
  for (int64_t d = 0; broadcastable && d < coeffs.dim(); ++d) {
    const int64_t size = coeffs.size(coeffs.dim() - 1 - d);
    broadcastable = size == 1 || size == args.sizes[ndim - 1 - d];
  }
  LINREC_CHECK(broadcastable, op, ": coeffs must be broadcastable to the shape of ", values_name, " ",
               shape_string(args.sizes), ", got ", shape_string(coeffs));
  LINREC_CHECK(!(log_coeffs && is_complex_dtype(args.dtype)), op,
               ": log_coeffs=True takes real coefficients (the log of a complex coefficient is ambiguous), got ",
               dtype_string(coeffs));

  args.initial_sizes = args.sizes;
  args.initial_sizes.erase(args.initial_sizes.begin() + args.time_dim);
  if (cu_seqlens) {
    const Tensor& offsets = *cu_seqlens;
    check_cu_seqlens(op, values_name, values, offsets, args.sizes[args.time_dim]);
    LINREC_CHECK(args.time_dim >= 1 && args.sizes[0] == 1, op, ": with cu_seqlens, ", values_name,
                 " packs its sequences along dim ", args.time_dim, " and must have a batch dim (dim 0) of size 1 "
                 "before it, got shape ", shape_string(args.sizes));
    args.initial_sizes[0] = offsets.size(0) - 1;
  }
  if (initial) {
    check_coeff_like(op, "initial", *initial, values_name, values);
    check_shape(op, "initial", *initial, args.initial_sizes,
                cu_seqlens ? "the shape of inputs without the time dim, dim 0 counting the cu_seqlens sequences"
                           : "the shape of inputs without the time dim");
  }
  args.mixed = coeffs.scalar_type() != values.scalar_type() ||
               (initial && initial->scalar_type() != values.scalar_type());
  return args;
}

// How one tensor maps onto the dims of inputs.
enum class Role {
  Full,       // has inputs' shape
  Broadcast,  // broadcastable to inputs' shape (coeffs)
  State,      // inputs' shape without the time dim (initial states), dim 0 per packed sequence with cu_seqlens
};

struct OperandBinding {
  const Tensor* tensor;  // nullptr: absent (no initial state)
  Role role;
  Operand* operand;
};

// Fills the layout's batch shape and every operand's strides: the dims other than time, size-1 dims
// dropped, ordered by the first operand's strides (outermost first, so that consecutive rows are
// neighbours in memory where possible) and merged where every operand steps through them evenly.
inline void bind_operands(const char* op, const Arguments& args, bool packed, SequenceLayout& layout,
                          std::initializer_list<OperandBinding> bindings) {
  const int64_t ndim = static_cast<int64_t>(args.sizes.size());
  struct Dim {
    int64_t size;
    std::vector<int64_t> strides;  // per binding
  };
  std::vector<Dim> dims;
  for (int64_t d = 0; d < ndim; ++d) {
    if (d == args.time_dim || args.sizes[d] == 1) continue;
    Dim dim{args.sizes[d], {}};
    for (const OperandBinding& binding : bindings) {
      int64_t stride = 0;
      if (binding.tensor != nullptr) {
        const Tensor& tensor = *binding.tensor;
        if (binding.role == Role::Full) {
          stride = tensor.stride(d);
        } else if (binding.role == Role::Broadcast) {
          const int64_t own = d - (ndim - tensor.dim());
          stride = own >= 0 && tensor.size(own) != 1 ? tensor.stride(own) : 0;
        } else {
          stride = tensor.stride(d < args.time_dim ? d : d - 1);
        }
      }
      dim.strides.push_back(stride);
    }
    dims.push_back(std::move(dim));
  }
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.strides[0] > b.strides[0]; });
  std::vector<Dim> merged;
  for (Dim& dim : dims) {
    bool fits = !merged.empty();
    for (size_t k = 0; fits && k < dim.strides.size(); ++k) fits = merged.back().strides[k] == dim.strides[k] * dim.size;
    if (fits) {
      merged.back().size *= dim.size;
      merged.back().strides = dim.strides;
    } else {
      merged.push_back(std::move(dim));
    }
  }
  LINREC_CHECK(merged.size() <= static_cast<size_t>(kMaxBatchDims), op, ": the dims other than time must merge into at most ",
               kMaxBatchDims, " strided dims, got ", merged.size(), " (make the tensors contiguous)");

  std::vector<int64_t> merged_sizes;
  for (const Dim& dim : merged) merged_sizes.push_back(dim.size);
  layout.shape = BatchShape::of(merged_sizes.data(), static_cast<int>(merged_sizes.size()));
  layout.seq_len = args.sizes[args.time_dim];
  size_t k = 0;
  for (const OperandBinding& binding : bindings) {
    Operand& operand = *binding.operand;
    operand = Operand{};
    if (binding.tensor != nullptr) {
      const Tensor& tensor = *binding.tensor;
      operand.data = const_cast<void*>(tensor.const_data_ptr());
      if (binding.role == Role::Full) {
        operand.time_stride = tensor.stride(args.time_dim);
      } else if (binding.role == Role::Broadcast) {
        const int64_t own = args.time_dim - (ndim - tensor.dim());
        operand.time_stride = own >= 0 && tensor.size(own) != 1 ? tensor.stride(own) : 0;
      }
      if (binding.role == Role::State && packed) operand.segment_stride = tensor.stride(0);
      // A single step never moves along time: call it contiguous, as the fast kernels want.
      if (layout.seq_len == 1) operand.time_stride = 1;
    }
    for (size_t d = 0; d < merged.size(); ++d) operand.strides[d] = merged[d].strides[k];
    ++k;
  }
}

inline void set_options(SequenceLayout& layout, const Arguments& args, bool reverse, const OptionalTensor& cu_seqlens,
                        bool log_coeffs, const char* op, int64_t threads_per_sequence, int64_t vectors_per_thread) {
  LINREC_CHECK(threads_per_sequence >= 0 && vectors_per_thread >= 0 &&
                   (threads_per_sequence == 0) == (vectors_per_thread == 0),
               op, ": threads_per_sequence and vectors_per_thread must both be 0 (automatic) or both positive, got ",
               threads_per_sequence, " and ", vectors_per_thread);
  layout.dtype = args.dtype;
  layout.coeff_dtype = args.mixed ? DType::Float32 : args.dtype;
  layout.reverse = reverse;
  layout.log_coeffs = log_coeffs;
  if (cu_seqlens) {
    layout.cu_seqlens = cu_seqlens->const_data_ptr();
    layout.cu_seqlens_int64 = cu_seqlens->scalar_type() == torch::headeronly::ScalarType::Long;
    layout.num_segments = cu_seqlens->size(0) - 1;
  }
  layout.threads_per_sequence = static_cast<int>(threads_per_sequence);
  layout.vectors_per_thread = static_cast<int>(vectors_per_thread);
}

// `gradient` (of inputs' shape) summed over the dims along which `coeffs` broadcast to it, in coeffs' shape.
inline Tensor sum_to(const Tensor& gradient, const Tensor& coeffs) {
  const int64_t leading = gradient.dim() - coeffs.dim();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < gradient.dim(); ++d)
    if (gradient.size(d) != 1 && (d < leading || coeffs.size(d - leading) == 1)) dims.push_back(d);
  const Tensor summed = torch::stable::sum(gradient, torch::headeronly::IntHeaderOnlyArrayRef(dims.data(), dims.size()),
                                           /*keepdim=*/true);
  return torch::stable::reshape(summed, sizes_of(coeffs));
}

// Launch(params, like): runs the kernel on the device of `like`.
template <void (*Launch)(const ForwardParams&, const Tensor&)>
Tensor forward_op(const Tensor& inputs, const Tensor& coeffs, int64_t dim, bool reverse, const OptionalTensor& initial,
                  const OptionalTensor& cu_seqlens, bool log_coeffs, int64_t threads_per_sequence,
                  int64_t vectors_per_thread) {
  constexpr const char* op = "linrec.forward";
  const Arguments args = check_arguments(op, "inputs", inputs, coeffs, dim, initial, cu_seqlens, log_coeffs);
  // Same strides as inputs where inputs are dense; no copy of any operand is made but the one of coeffs
  // or initial that mixed precision converts to the other's float32.
  Tensor outputs = torch::stable::empty_like(inputs);
  const Tensor read_coeffs = converted(coeffs, args.coeff_type(inputs));
  const OptionalTensor read_initial = converted(initial, args.coeff_type(inputs));

  ForwardParams params;
  set_options(params, args, reverse, cu_seqlens, log_coeffs, op, threads_per_sequence, vectors_per_thread);
  bind_operands(op, args, cu_seqlens.has_value(), params,
                {{&outputs, Role::Full, &params.outputs},
                 {&inputs, Role::Full, &params.inputs},
                 {&read_coeffs, Role::Broadcast, &params.coeffs},
                 {read_initial ? &*read_initial : nullptr, Role::State, &params.initial}});
  if (params.numel() > 0) Launch(params, inputs);
  return outputs;
}

// An uninitialized per-element gradient in `dtype`, laid out like `outputs` (its strides, where it is
// dense). The stable ABI of torch 2.10 has no empty_like taking a dtype: a contiguous one is allocated
// directly, another layout converted from an empty_like, whose conversion keeps its strides.
inline Tensor per_element_like(const Tensor& outputs, torch::headeronly::ScalarType dtype) {
  if (outputs.scalar_type() != dtype && outputs.is_contiguous())
    return torch::stable::new_empty(outputs, sizes_of(outputs), dtype);
  return converted(torch::stable::empty_like(outputs), dtype);
}

// The dtype in which broadcast coefficients' gradients are summed: float32 for the 16-bit types.
inline torch::headeronly::ScalarType sum_dtype(const Tensor& tensor) {
  using torch::headeronly::ScalarType;
  const ScalarType dtype = tensor.scalar_type();
  return dtype == ScalarType::Half || dtype == ScalarType::BFloat16 ? ScalarType::Float : dtype;
}

// How a device's backward launcher produces the gradient of broadcast coeffs.
enum class CoeffGradientSum {
  InKernel,  // the kernels add each element's gradient into coeffs' shape (BackwardParams::sum_d_coeffs)
  AfterKernel,  // the kernels write it per element, and the op sums it over the broadcast dims
};

// Returns (d_inputs, d_coeffs, d_initial). d_coeffs has coeffs' shape (summed over the dims coeffs
// are broadcast along); d_initial has initial's shape, or is empty without an initial state.
template <void (*Launch)(const BackwardParams&, const Tensor&), CoeffGradientSum Sum>
std::tuple<Tensor, Tensor, Tensor> backward_op(const Tensor& d_outputs, const Tensor& coeffs, const Tensor& outputs,
                                               int64_t dim, bool reverse, const OptionalTensor& initial,
                                               const OptionalTensor& cu_seqlens, bool log_coeffs,
                                               int64_t threads_per_sequence, int64_t vectors_per_thread) {
  constexpr const char* op = "linrec.backward";
  const Arguments args = check_arguments(op, "d_outputs", d_outputs, coeffs, dim, initial, cu_seqlens, log_coeffs);
  check_like(op, "outputs", outputs, "d_outputs", d_outputs);
  check_shape(op, "outputs", outputs, args.sizes, "the shape of d_outputs");
  const auto coeff_type = args.coeff_type(d_outputs);
  const Tensor read_coeffs = converted(coeffs, coeff_type);
  const OptionalTensor read_initial = converted(initial, coeff_type);
  // Laid out like outputs (inputs' layout): d_outputs is often an expanded or otherwise odd gradient.
  Tensor d_inputs = torch::stable::empty_like(outputs);
  // Zeros: packed sequences of length 0 have no element to compute their gradient from.
  Tensor d_initial =
      torch::stable::new_zeros(d_outputs, initial ? args.initial_sizes : std::vector<int64_t>{0},
                               initial ? coeff_type : d_outputs.scalar_type());
  const std::vector<int64_t> coeff_sizes = sizes_of(coeffs);
  // Broadcast along a dim of size > 1: elements share a coefficient, and its gradient is their sum.
  const bool broadcast = coeffs.numel() < d_outputs.numel();
  const bool in_kernel = broadcast && Sum == CoeffGradientSum::InKernel;
  // Per element: laid out like outputs (coeffs of another shape with as many elements, such as
  // coeffs without inputs' leading dims of size 1, take their own dense layout). Summed in the
  // kernel: a zeroed buffer of the sum's dtype in coeffs' shape. Zeros where no element exists to
  // contribute (an empty time dim under coeffs that broadcast along it).
  Tensor d_coeffs = in_kernel ? torch::stable::new_zeros(read_coeffs, coeff_sizes, sum_dtype(read_coeffs))
                    : broadcast || coeff_sizes == args.sizes ? per_element_like(outputs, coeff_type)
                    : d_outputs.numel() == 0                 ? torch::stable::new_zeros(read_coeffs, coeff_sizes)
                                                             : torch::stable::new_empty(read_coeffs, coeff_sizes);

  BackwardParams params;
  set_options(params, args, reverse, cu_seqlens, log_coeffs, op, threads_per_sequence, vectors_per_thread);
  params.sum_d_coeffs = in_kernel;
  bind_operands(op, args, cu_seqlens.has_value(), params,
                {{&d_inputs, Role::Full, &params.d_inputs},
                 {&d_coeffs, broadcast && !in_kernel ? Role::Full : Role::Broadcast, &params.d_coeffs},
                 {&d_outputs, Role::Full, &params.d_outputs},
                 {&outputs, Role::Full, &params.outputs},
                 {&read_coeffs, Role::Broadcast, &params.coeffs},
                 {read_initial ? &*read_initial : nullptr, Role::State, &params.initial},
                 {initial ? &d_initial : nullptr, Role::State, &params.d_initial}});
  if (params.numel() > 0) Launch(params, d_outputs);
  if (broadcast && !in_kernel) d_coeffs = sum_to(d_coeffs, coeffs);
  // Each gradient in its argument's dtype: from the float32 sum of 16-bit coefficients' gradient, and
  // from the float32 that mixed precision read a 16-bit coeffs or initial in.
  d_coeffs = converted(d_coeffs, coeffs.scalar_type());
  if (initial) d_initial = converted(d_initial, initial->scalar_type());
  return {d_inputs, d_coeffs, d_initial};
}

}  // namespace linrec
