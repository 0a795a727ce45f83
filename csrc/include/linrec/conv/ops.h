// The causal convolution's op bodies: argument checks, output allocation, the params structs
// (conv/params.h), and the sum of the blocks' partial d_weight and d_bias. The CUDA file instantiates
// them with its launcher; the CPU runs linrec.causal_conv1d's composed path, which takes any width.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <tuple>
#include <vector>

#include "linrec/conv/params.h"
#include "linrec/ops.h"
#include "linrec/ssm/ops.h"  // check_tensor, element_type, is_real_floating

namespace linrec __attribute__((visibility("hidden"))) {
namespace conv {

using torch::headeronly::ScalarType;

// Checks weight (dim, width), width 1 to kMaxWidth, and bias (dim,) beside x (batch, dim, ...): float32, or float64
// beside float64 x, on x's device, contiguous. Returns the width.
inline int check_filter(const char* op, const Tensor& x, const Tensor& weight, const OptionalTensor& bias) {
  const int64_t dim = x.size(1);
  const ScalarType real = x.scalar_type() == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const std::string real_text = dtype_string(real);
  LINREC_CHECK(weight.dim() == 2 && weight.size(0) == dim && weight.size(1) >= 1 && weight.size(1) <= kMaxWidth, op,
               ": weight must be (dim, width) with dim = ", dim, " and width 1 to ", kMaxWidth, ", got shape ",
               shape_string(weight));
  ssm::check_tensor(op, "weight", weight, x, {real}, real_text.c_str(), {dim, weight.size(1)}, "(dim, width)");
  if (bias) ssm::check_tensor(op, "bias", *bias, x, {real}, real_text.c_str(), {dim}, "(dim,)");
  return static_cast<int>(weight.size(1));
}

inline bool steps_aligned(const Tensor& tensor);

// Whether every time row of time-last `tensor`, and of the contiguous tensors of its shape, starts 16-byte aligned.
inline bool rows_aligned(const Tensor& tensor) {
  const int64_t bytes = tensor.element_size();
  return reinterpret_cast<uintptr_t>(tensor.const_data_ptr()) % 16 == 0 && (tensor.size(2) * bytes) % 16 == 0 &&
         (tensor.stride(0) * bytes) % 16 == 0 && (tensor.stride(1) * bytes) % 16 == 0;
}

// Checks the forward's arguments and fills the params (every pointer but the outputs').
inline ForwardParams check_arguments(const char* op, const Tensor& x, const Tensor& weight, const OptionalTensor& bias,
                                     bool silu, const OptionalTensor& initial, const OptionalTensor& cu_seqlens) {
  LINREC_CHECK_TYPE(ssm::is_real_floating(x.scalar_type()), op,
                    ": x must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, got ", dtype_string(x));
  LINREC_CHECK(x.dim() == 3, op, ": x must be 3-dim (batch, dim, length), got shape ", shape_string(x));
  const bool channel_last = x.stride(2) != 1 && x.stride(1) == 1;
  LINREC_CHECK(x.stride(2) == 1 || channel_last, op, ": x must be time-last (stride 1 along dim 2) or channel-last "
               "(stride 1 along dim 1), got strides ", x.stride(0), ", ", x.stride(1), ", ", x.stride(2));
  const ScalarType real = x.scalar_type() == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  const std::string real_text = dtype_string(real);
  ForwardParams p;
  p.channel_last = channel_last;
  p.x_batch_stride = x.stride(0);
  p.x_channel_stride = x.stride(1);
  p.x_time_stride = x.stride(2);
  p.dtype = ssm::element_type(x.scalar_type());
  p.batch = x.size(0), p.dim = x.size(1), p.length = x.size(2);
  p.width = check_filter(op, x, weight, bias);
  p.sequences.count = p.batch;
  p.sequences.length = p.length;
  if (cu_seqlens) {
    check_cu_seqlens(op, "x", x, *cu_seqlens, p.length);
    LINREC_CHECK(p.batch == 1, op, ": with cu_seqlens, x holds its sequences packed along its length with a batch "
                 "of 1, got shape ", shape_string(x));
    p.sequences.count = cu_seqlens->size(0) - 1;
    p.sequences.cu_seqlens = cu_seqlens->const_data_ptr();
    p.sequences.offsets_int64 = cu_seqlens->scalar_type() == ScalarType::Long;
  }
  if (initial)
    ssm::check_tensor(op, "initial_states", *initial, x, {real}, real_text.c_str(),
                      {p.sequences.count, p.dim, p.width - 1}, "(sequences, dim, width - 1)");
  p.silu = silu;
  p.x = x.const_data_ptr();
  p.weight = weight.const_data_ptr();
  p.bias = bias ? bias->const_data_ptr() : nullptr;
  p.initial = initial ? initial->const_data_ptr() : nullptr;
  p.vectorized = channel_last ? steps_aligned(x) : rows_aligned(x);
  return p;
}

// Whether every step's channels of channel-last `tensor` start 16-byte aligned (and so those of the dense
// tensors of its shape that the op allocates).
inline bool steps_aligned(const Tensor& tensor) {
  const int64_t bytes = tensor.element_size();
  return reinterpret_cast<uintptr_t>(tensor.const_data_ptr()) % 16 == 0 && (tensor.size(1) * bytes) % 16 == 0 &&
         (tensor.stride(0) * bytes) % 16 == 0 && (tensor.stride(2) * bytes) % 16 == 0;
}

// A tensor of x's shape and dtype in the layout of the op's outputs: contiguous, or for channel-last x, dense
// (batch, length, dim) transposed.
inline Tensor new_like_x(const Tensor& x, const ForwardParams& p) {
  if (!p.channel_last) return torch::stable::new_empty(x, sizes_of(x));
  return torch::stable::transpose(torch::stable::new_empty(x, {p.batch, p.length, p.dim}), 1, 2);
}

inline bool in_output_layout(const Tensor& tensor, const ForwardParams& p) {
  if (!p.channel_last) return tensor.is_contiguous();
  return tensor.stride(1) == 1 && tensor.stride(2) == p.dim && tensor.stride(0) == p.length * p.dim;
}

// (out, final_states): final_states (sequences, dim, width - 1) in x's dtype where asked, else empty.
template <void (*Launch)(const ForwardParams&, const Tensor&)>
std::tuple<Tensor, Tensor> forward_op(const Tensor& x, const Tensor& weight, const OptionalTensor& bias, bool silu,
                                      const OptionalTensor& initial, const OptionalTensor& cu_seqlens,
                                      bool return_final_states) {
  ForwardParams p = check_arguments("linrec.causal_conv1d_forward", x, weight, bias, silu, initial, cu_seqlens);
  Tensor out = new_like_x(x, p);
  Tensor final_states = torch::stable::new_empty(
      x, return_final_states ? std::vector<int64_t>{p.sequences.count, p.dim, p.width - 1} : std::vector<int64_t>{0});
  p.out = out.mutable_data_ptr();
  p.final_states = return_final_states ? final_states.mutable_data_ptr() : nullptr;
  Launch(p, x);
  return {out, final_states};
}

// (d_x, d_weight, d_bias, d_initial_states) for d_out and d_final_states (None: zero); d_weight and d_bias in
// weight's dtype, the gradients of absent optional arguments empty.
template <void (*Launch)(const BackwardParams&, const Tensor&)>
std::tuple<Tensor, Tensor, Tensor, Tensor> backward_op(const Tensor& d_out, const OptionalTensor& d_final_states,
                                                       const Tensor& x, const Tensor& weight,
                                                       const OptionalTensor& bias, bool silu,
                                                       const OptionalTensor& initial,
                                                       const OptionalTensor& cu_seqlens) {
  constexpr const char* op = "linrec.causal_conv1d_backward";
  BackwardParams p;
  static_cast<ForwardParams&>(p) = check_arguments(op, x, weight, bias, silu, initial, cu_seqlens);
  const std::string values_text = dtype_string(x);
  LINREC_CHECK(d_out.device() == x.device() && d_out.scalar_type() == x.scalar_type() && sizes_of(d_out) == sizes_of(x),
               op, ": d_out must have x's device, dtype and shape ", shape_string(x), ", got ", shape_string(d_out), " ",
               dtype_string(d_out));
  LINREC_CHECK(in_output_layout(d_out, p), op, ": d_out must be in the output's layout (",
               p.channel_last ? "dense (batch, length, dim) transposed" : "contiguous", ")");
  if (d_final_states)
    ssm::check_tensor(op, "d_final_states", *d_final_states, x, {x.scalar_type()}, values_text.c_str(),
                      {p.sequences.count, p.dim, p.width - 1}, "(sequences, dim, width - 1)");
  p.vectorized = p.vectorized && (p.channel_last ? steps_aligned(d_out) : rows_aligned(d_out));
  p.d_out = d_out.const_data_ptr();
  p.d_final_states = d_final_states ? d_final_states->const_data_ptr() : nullptr;
  const ScalarType real = weight.scalar_type();
  Tensor d_x = new_like_x(x, p);
  Tensor partial = torch::stable::new_zeros(x, {p.batch * time_blocks(p), p.dim, p.width + 1}, real);
  Tensor d_initial = torch::stable::new_empty(x, initial ? sizes_of(*initial) : std::vector<int64_t>{0}, real);
  p.d_x = d_x.mutable_data_ptr();
  p.d_weight_partial = partial.mutable_data_ptr();
  p.d_initial = initial ? d_initial.mutable_data_ptr() : nullptr;
  Launch(p, x);
  // The blocks' sums, added up in a fixed order (deterministic).
  const std::vector<int64_t> blocks_dim{0};
  Tensor sums = torch::stable::sum(partial, torch::headeronly::IntHeaderOnlyArrayRef(blocks_dim));  // (dim, width + 1)
  Tensor d_weight = torch::stable::contiguous(torch::stable::narrow(sums, 1, 0, p.width));
  Tensor d_bias = bias ? torch::stable::contiguous(torch::stable::select(sums, 1, p.width))
                       : torch::stable::new_empty(x, {0}, real);
  return {d_x, d_weight, d_bias, d_initial};
}

// The decode step: out of x's shape, state updated in place.
template <void (*Launch)(const UpdateParams&, const Tensor&)>
Tensor update_op(Tensor state, const Tensor& x, const Tensor& weight, const OptionalTensor& bias, bool silu,
                 const OptionalTensor& state_indices) {
  constexpr const char* op = "linrec.causal_conv1d_update";
  LINREC_CHECK_TYPE(ssm::is_real_floating(x.scalar_type()), op,
                    ": x must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, got ", dtype_string(x));
  LINREC_CHECK(x.dim() == 3, op, ": x must be 3-dim (batch, dim, steps), got shape ", shape_string(x));
  LINREC_CHECK(x.is_contiguous(), op, ": x must be contiguous");
  UpdateParams p;
  p.dtype = ssm::element_type(x.scalar_type());
  p.batch = x.size(0), p.dim = x.size(1), p.steps = x.size(2);
  p.width = check_filter(op, x, weight, bias);
  LINREC_CHECK(state.dim() == 3 && state.size(1) == p.dim && state.size(2) >= p.width - 1, op,
               ": conv_state must be (slots, dim, state_len) with dim = ", p.dim, " and state_len >= width - 1 = ",
               p.width - 1, ", got shape ", shape_string(state));
  const std::string state_text = dtype_string(x) + " or torch.float32";
  ssm::check_tensor(op, "conv_state", state, x, {x.scalar_type(), ScalarType::Float}, state_text.c_str(),
                    sizes_of(state), "(slots, dim, state_len)");
  p.state_dtype = ssm::element_type(state.scalar_type());
  p.state_len = state.size(2);
  p.rows.count = state.size(0);
  if (state_indices) {
    ssm::check_tensor(op, "conv_state_indices", *state_indices, x, {ScalarType::Int, ScalarType::Long},
                      "torch.int32 or torch.int64", {p.batch}, "(batch,)");
    p.rows.state_rows = state_indices->const_data_ptr();
    p.rows.state_rows_int64 = state_indices->scalar_type() == ScalarType::Long;
  } else {
    LINREC_CHECK(p.rows.count == p.batch, op, ": conv_state must hold a row per batch row (", p.batch,
                 ") without conv_state_indices, got shape ", shape_string(state));
  }
  p.silu = silu;
  p.x = x.const_data_ptr();
  p.weight = weight.const_data_ptr();
  p.bias = bias ? bias->const_data_ptr() : nullptr;
  p.state = state.mutable_data_ptr();
  Tensor out = torch::stable::new_empty(x, sizes_of(x));
  p.out = out.mutable_data_ptr();
  Launch(p, x);
  return out;
}

}  // namespace conv
}  // namespace linrec
