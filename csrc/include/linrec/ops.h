// The op bodies shared by every device: argument checks, output allocation and the translation
// from stable-ABI tensors to the plain params structs. Each device's file instantiates them with
// its own launcher and registers the result in its STABLE_TORCH_LIBRARY_IMPL block.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <initializer_list>
#include <tuple>
#include <utility>

#include "linrec/check.h"
#include "linrec/params.h"

// Hidden like torch::stable itself, whose Tensor these types hold.
namespace linrec __attribute__((visibility("hidden"))) {

using torch::stable::Tensor;

// A tensor together with the name the op schema gives it, for error messages.
struct NamedTensor {
  const char* name;
  const Tensor& tensor;
};

inline std::string shape_string(const Tensor& tensor) {
  std::string text = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) text += (d ? ", " : "") + std::to_string(tensor.size(d));
  return text + "]";
}

inline std::string device_string(const Tensor& tensor) {
  if (tensor.is_cpu()) return "cpu";
  const std::string type = tensor.is_cuda() ? "cuda" : "device type " + std::to_string(static_cast<int>(tensor.device().type()));
  return type + ":" + std::to_string(tensor.get_device_index());
}

inline bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != b.size(d)) return false;
  return true;
}

inline DType to_dtype(torch::headeronly::ScalarType scalar_type, const char* op, const char* name) {
  using torch::headeronly::ScalarType;
  switch (scalar_type) {
    case ScalarType::Float: return DType::Float32;
    case ScalarType::Double: return DType::Float64;
    case ScalarType::Half: return DType::Float16;
    case ScalarType::BFloat16: return DType::BFloat16;
    default: break;
  }
  throw std::invalid_argument(concat(op, ": ", name, " must be float32, float64, float16 or bfloat16, got ",
                                     torch::headeronly::toString(scalar_type)));
}

// Every operand must match the first one in shape, device and dtype; time is the last dim.
inline DType check_operands(const char* op, std::initializer_list<NamedTensor> operands) {
  const NamedTensor& first = *operands.begin();
  LINREC_CHECK(first.tensor.defined(), op, ": ", first.name, " must be a tensor, got None");
  LINREC_CHECK(first.tensor.dim() >= 1, op, ": ", first.name,
               " must have at least one dim (time is the last), got a 0-dim tensor");
  const DType dtype = to_dtype(first.tensor.scalar_type(), op, first.name);
  for (const NamedTensor& other : operands) {
    LINREC_CHECK(other.tensor.defined(), op, ": ", other.name, " must be a tensor, got None");
    LINREC_CHECK(same_shape(other.tensor, first.tensor),
                 op, ": ", other.name, " must have the shape of ", first.name, " ",
                 shape_string(first.tensor), ", got ", shape_string(other.tensor));
    LINREC_CHECK(other.tensor.device() == first.tensor.device(), op, ": ", other.name,
                 " must be on the device of ", first.name, " (", device_string(first.tensor), "), got ",
                 device_string(other.tensor));
    LINREC_CHECK(other.tensor.scalar_type() == first.tensor.scalar_type(), op, ": ", other.name,
                 " must have the dtype of ", first.name, " (",
                 torch::headeronly::toString(first.tensor.scalar_type()), "), got ",
                 torch::headeronly::toString(other.tensor.scalar_type()));
  }
  return dtype;
}

inline SequenceLayout sequence_layout(const char* op, const Tensor& like, DType dtype, bool reverse,
                                      int64_t threads_per_sequence, int64_t vectors_per_thread) {
  LINREC_CHECK(threads_per_sequence >= 0 && vectors_per_thread >= 0 &&
                   (threads_per_sequence == 0) == (vectors_per_thread == 0),
               op, ": threads_per_sequence and vectors_per_thread must both be 0 (automatic) or both positive, got ",
               threads_per_sequence, " and ", vectors_per_thread);
  SequenceLayout layout;
  layout.seq_len = like.size(like.dim() - 1);
  layout.num_sequences = layout.seq_len == 0 ? 0 : like.numel() / layout.seq_len;
  layout.reverse = reverse;
  layout.dtype = dtype;
  layout.threads_per_sequence = static_cast<int>(threads_per_sequence);
  layout.vectors_per_thread = static_cast<int>(vectors_per_thread);
  return layout;
}

// The kernels read rows of contiguous elements; other layouts are copied once here.
inline Tensor as_contiguous(const Tensor& tensor) {
  return tensor.is_contiguous() ? tensor : torch::stable::contiguous(tensor);
}

inline Tensor new_output(const Tensor& like) { return torch::stable::new_empty(like, like.sizes()); }

// Launch(params, like): runs the kernel on the device of `like`.
template <void (*Launch)(const ForwardParams&, const Tensor&)>
Tensor forward_op(const Tensor& inputs_arg, const Tensor& coeffs_arg, bool reverse, int64_t threads_per_sequence,
                  int64_t vectors_per_thread) {
  const DType dtype = check_operands("linrec.forward", {{"inputs", inputs_arg}, {"coeffs", coeffs_arg}});
  const Tensor inputs = as_contiguous(inputs_arg);
  const Tensor coeffs = as_contiguous(coeffs_arg);
  Tensor outputs = new_output(inputs);

  ForwardParams params;
  static_cast<SequenceLayout&>(params) =
      sequence_layout("linrec.forward", inputs, dtype, reverse, threads_per_sequence, vectors_per_thread);
  params.inputs = inputs.const_data_ptr();
  params.coeffs = coeffs.const_data_ptr();
  params.outputs = outputs.mutable_data_ptr();
  if (params.numel() > 0) Launch(params, inputs);
  return outputs;
}

template <void (*Launch)(const BackwardParams&, const Tensor&)>
std::tuple<Tensor, Tensor> backward_op(const Tensor& d_outputs_arg, const Tensor& coeffs_arg,
                                       const Tensor& outputs_arg, bool reverse, int64_t threads_per_sequence,
                                       int64_t vectors_per_thread) {
  const DType dtype = check_operands(
      "linrec.backward", {{"d_outputs", d_outputs_arg}, {"coeffs", coeffs_arg}, {"outputs", outputs_arg}});
  const Tensor d_outputs = as_contiguous(d_outputs_arg);
  const Tensor coeffs = as_contiguous(coeffs_arg);
  const Tensor outputs = as_contiguous(outputs_arg);
  Tensor d_inputs = new_output(d_outputs);
  Tensor d_coeffs = new_output(d_outputs);

  BackwardParams params;
  static_cast<SequenceLayout&>(params) =
      sequence_layout("linrec.backward", d_outputs, dtype, reverse, threads_per_sequence, vectors_per_thread);
  params.d_outputs = d_outputs.const_data_ptr();
  params.coeffs = coeffs.const_data_ptr();
  params.outputs = outputs.const_data_ptr();
  params.d_inputs = d_inputs.mutable_data_ptr();
  params.d_coeffs = d_coeffs.mutable_data_ptr();
  if (params.numel() > 0) Launch(params, d_outputs);
  return {d_inputs, d_coeffs};
}

}  // namespace linrec
