// The selective-scan op bodies shared by the CPU and CUDA: argument checks, output allocation, the
// params structs (ssm/params.h), and the sums of the per-row partial gradients. Each device's file
// instantiates them with its own launcher and registers them.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <tuple>
#include <vector>

#include "linrec/ops.h"
#include "linrec/ssm/params.h"

namespace linrec __attribute__((visibility("hidden"))) {
namespace ssm {

using torch::headeronly::ScalarType;

// The checked shape of a call and the dtypes it runs in.
struct Shape {
  int64_t batch = 0, d = 0, n = 0, length = 0, sequences = 0;
  ScalarType values = ScalarType::Float;  // T: u, delta, z, out
  ScalarType real = ScalarType::Float;    // R: float32, or float64 beside float64 T; D and delta_bias
  ScalarType state = ScalarType::Float;   // S: R, or complex beside a complex A
};

inline bool is_complex_type(ScalarType type) {
  return type == ScalarType::ComplexFloat || type == ScalarType::ComplexDouble;
}

inline bool is_real_floating(ScalarType type) {
  return type == ScalarType::Float || type == ScalarType::Double || type == ScalarType::Half ||
         type == ScalarType::BFloat16;
}

inline void check_tensor(const char* op, const char* name, const Tensor& tensor, const Tensor& u,
                         std::initializer_list<ScalarType> dtypes, const char* dtypes_text,
                         const std::vector<int64_t>& shape, const char* shape_text) {
  LINREC_CHECK(tensor.device() == u.device(), op, ": ", name, " must be on the device of u (", device_string(u),
               "), got ", device_string(tensor));
  bool allowed = false;
  for (ScalarType type : dtypes) allowed = allowed || tensor.scalar_type() == type;
  LINREC_CHECK_TYPE(allowed, op, ": ", name, " must be ", dtypes_text, ", got ", dtype_string(tensor));
  check_shape(op, name, tensor, shape, shape_text);
  LINREC_CHECK(tensor.is_contiguous(), op, ": ", name, " must be contiguous");
}

// B or C: fixed (d, n) in S, or varying (batch, groups, n, length) in T or a real S, or in a complex S.
inline Projection check_projection(const char* op, const char* name, const Tensor& M, const Tensor& u,
                                   const Shape& shape) {
  Projection projection;
  projection.data = M.const_data_ptr();
  const std::string state_text = dtype_string(shape.state);
  if (M.dim() == 2) {
    check_tensor(op, name, M, u, {shape.state}, state_text.c_str(), {shape.d, shape.n}, "fixed: (d, n)");
    return projection;
  }
  LINREC_CHECK(M.dim() == 4, op, ": ", name, " must be fixed (d, n) or varying (batch, groups, n, length), got shape ",
               shape_string(M));
  projection.varying = true;
  projection.groups = M.size(1);
  LINREC_CHECK(projection.groups > 0 && shape.d % projection.groups == 0, op, ": the groups of ", name,
               " (its dim 1, ", projection.groups, ") must divide d = ", shape.d, ", got shape ", shape_string(M));
  if (is_complex_type(shape.state))
    check_tensor(op, name, M, u, {shape.state}, state_text.c_str(), {shape.batch, projection.groups, shape.n, shape.length},
                 "varying: (batch, groups, n, length)");
  else
    check_tensor(op, name, M, u, {shape.values, shape.state}, "the dtype of u or of A",
                 {shape.batch, projection.groups, shape.n, shape.length}, "varying: (batch, groups, n, length)");
  projection.wide = M.scalar_type() != shape.values;
  return projection;
}

inline DType element_type(ScalarType type) {
  switch (type) {
    case ScalarType::Double: return DType::Float64;
    case ScalarType::Half: return DType::Float16;
    case ScalarType::BFloat16: return DType::BFloat16;
    case ScalarType::ComplexFloat: return DType::Complex64;
    case ScalarType::ComplexDouble: return DType::Complex128;
    default: return DType::Float32;
  }
}

// Whether every time row of these tensors (contiguous, time last; null: absent) starts 16-byte aligned.
inline bool rows_aligned(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    if (tensor == nullptr) continue;
    const int64_t row_bytes = tensor->size(tensor->dim() - 1) * static_cast<int64_t>(tensor->element_size());
    if (row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(tensor->const_data_ptr()) % 16 != 0) return false;
  }
  return true;
}

// Checks the forward's arguments and fills the params (every pointer but the outputs').
inline ForwardParams check_arguments(const char* op, Shape& shape, const Tensor& u, const Tensor& delta,
                                     const Tensor& A, const Tensor& B, const Tensor& C, const OptionalTensor& D,
                                     const OptionalTensor& z, const OptionalTensor& delta_bias, bool delta_softplus,
                                     const OptionalTensor& initial, const OptionalTensor& cu_seqlens) {
  LINREC_CHECK_TYPE(is_real_floating(u.scalar_type()), op, ": u must be torch.float32, torch.float64, torch.float16 or torch.bfloat16, got ",
                    dtype_string(u));
  LINREC_CHECK(u.dim() == 3, op, ": u must be 3-dim (batch, d, length), got shape ", shape_string(u));
  LINREC_CHECK(u.is_contiguous(), op, ": u must be contiguous");
  shape.values = u.scalar_type();
  shape.real = shape.values == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  shape.batch = u.size(0);
  shape.d = u.size(1);
  shape.length = u.size(2);
  const std::string real_text = dtype_string(shape.real);
  LINREC_CHECK(A.dim() == 2 && A.size(0) == shape.d, op, ": A must be (d, n) with d = ", shape.d, ", got shape ",
               shape_string(A));
  shape.n = A.size(1);
  const ScalarType complex_state = shape.real == ScalarType::Double ? ScalarType::ComplexDouble : ScalarType::ComplexFloat;
  const std::string A_text = real_text + " or " + dtype_string(complex_state);
  check_tensor(op, "A", A, u, {shape.real, complex_state}, A_text.c_str(), {shape.d, shape.n}, "(d, n)");
  shape.state = A.scalar_type();
  const std::string state_text = dtype_string(shape.state);
  check_tensor(op, "delta", delta, u, {shape.values}, "the dtype of u", sizes_of(u), "u's");
  if (z) check_tensor(op, "z", *z, u, {shape.values}, "the dtype of u", sizes_of(u), "u's");
  if (D) check_tensor(op, "D", *D, u, {shape.real}, real_text.c_str(), {shape.d}, "(d,)");
  if (delta_bias) check_tensor(op, "delta_bias", *delta_bias, u, {shape.real}, real_text.c_str(), {shape.d}, "(d,)");
  shape.sequences = shape.batch;
  ForwardParams params;
  if (cu_seqlens) {
    check_cu_seqlens(op, "u", u, *cu_seqlens, shape.length);
    LINREC_CHECK(shape.batch == 1, op, ": with cu_seqlens, u holds its sequences packed along its length with a batch "
                 "of 1, got shape ", shape_string(u));
    shape.sequences = cu_seqlens->size(0) - 1;
    params.sequences.cu_seqlens = cu_seqlens->const_data_ptr();
    params.sequences.offsets_int64 = cu_seqlens->scalar_type() == ScalarType::Long;
  }
  params.sequences.count = shape.sequences;
  params.sequences.length = shape.length;
  if (initial)
    check_tensor(op, "initial", *initial, u, {shape.state}, state_text.c_str(), {shape.sequences, shape.d, shape.n},
                 "(sequences, d, n)");
  params.dtype = element_type(shape.values);
  params.state_dtype = element_type(shape.state);
  params.batch = shape.batch;
  params.d = shape.d;
  params.n = shape.n;
  params.length = shape.length;
  params.u = u.const_data_ptr();
  params.delta = delta.const_data_ptr();
  params.z = z ? z->const_data_ptr() : nullptr;
  params.A = A.const_data_ptr();
  params.B = check_projection(op, "B", B, u, shape);
  params.C = check_projection(op, "C", C, u, shape);
  LINREC_CHECK_TYPE(!params.B.varying || !params.C.varying || B.scalar_type() == C.scalar_type(), op,
                    ": a varying C must have the dtype of a varying B (", dtype_string(B), "), got ", dtype_string(C));
  params.D = D ? D->const_data_ptr() : nullptr;
  params.delta_bias = delta_bias ? delta_bias->const_data_ptr() : nullptr;
  params.delta_softplus = delta_softplus;
  params.initial = initial ? initial->const_data_ptr() : nullptr;
  params.vectorized = rows_aligned({&u, &delta, z ? &*z : nullptr, B.dim() == 4 ? &B : nullptr,
                                    C.dim() == 4 ? &C : nullptr});
  return params;
}

// (out, checkpoints, last_state).
template <void (*Launch)(const ForwardParams&, const Tensor&)>
std::tuple<Tensor, Tensor, Tensor> forward_op(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                              const Tensor& C, const OptionalTensor& D, const OptionalTensor& z,
                                              const OptionalTensor& delta_bias, bool delta_softplus,
                                              const OptionalTensor& initial, const OptionalTensor& cu_seqlens) {
  constexpr const char* op = "linrec.selective_scan_forward";
  Shape shape;
  ForwardParams params =
      check_arguments(op, shape, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens);
  Tensor out = torch::stable::new_empty(u, sizes_of(u));
  Tensor checkpoints =
      torch::stable::new_empty(u, {shape.batch, shape.d, chunks_of(shape.length), shape.n}, shape.state);
  Tensor last_state = torch::stable::new_empty(u, {shape.sequences, shape.d, shape.n}, shape.state);
  params.out = out.mutable_data_ptr();
  params.checkpoints = checkpoints.mutable_data_ptr();
  params.last_state = last_state.mutable_data_ptr();
  Launch(params, u);
  return {out, checkpoints, last_state};
}

// A decode step: the forward of one step from each batch row's row of `state` (slots, d, n), written
// back in place; u, delta and z (batch, d, 1), varying B and C (batch, groups, n, 1). Returns out.
template <typename Params, void (*Launch)(const Params&, const Tensor&)>
Tensor state_update_op(Tensor state, const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                       const Tensor& C, const OptionalTensor& D, const OptionalTensor& z,
                       const OptionalTensor& delta_bias, bool delta_softplus, const OptionalTensor& state_indices) {
  constexpr const char* op = "linrec.selective_state_update";
  Shape shape;
  Params params;
  static_cast<ForwardParams&>(params) =
      check_arguments(op, shape, u, delta, A, B, C, D, z, delta_bias, delta_softplus, {}, {});
  LINREC_CHECK(shape.length == 1, op, ": u must be (batch, d, 1), one step, got shape ", shape_string(u));
  LINREC_CHECK(state.dim() == 3, op, ": state must be (slots, d, n), got shape ", shape_string(state));
  const int64_t slots = state.size(0);
  const std::string state_text = dtype_string(shape.state);
  check_tensor(op, "state", state, u, {shape.state}, state_text.c_str(), {slots, shape.d, shape.n}, "(slots, d, n)");
  if (state_indices) {
    check_tensor(op, "state_indices", *state_indices, u, {ScalarType::Int, ScalarType::Long}, "torch.int32 or torch.int64",
                 {shape.batch}, "(batch,)");
    params.sequences.state_rows = state_indices->const_data_ptr();
    params.sequences.state_rows_int64 = state_indices->scalar_type() == ScalarType::Long;
  } else {
    LINREC_CHECK(slots == shape.batch, op, ": state must hold a row per batch row (", shape.batch,
                 ") without state_indices, got shape ", shape_string(state));
  }
  params.sequences.count = slots;
  params.initial = state.const_data_ptr();
  params.last_state = state.mutable_data_ptr();
  Tensor out = torch::stable::new_empty(u, sizes_of(u));
  params.out = out.mutable_data_ptr();
  Launch(params, u);
  return out;
}

// (d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial); the gradients of absent optional
// arguments are empty. d_B and d_C have the dtype of B and C.
template <void (*Launch)(const BackwardParams&, const Tensor&)>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_op(
    const Tensor& d_out, const OptionalTensor& d_last_state, const Tensor& u, const Tensor& delta, const Tensor& A,
    const Tensor& B, const Tensor& C, const OptionalTensor& D, const OptionalTensor& z,
    const OptionalTensor& delta_bias, bool delta_softplus, const OptionalTensor& initial,
    const OptionalTensor& cu_seqlens, const Tensor& checkpoints, bool deterministic) {
  constexpr const char* op = "linrec.selective_scan_backward";
  Shape shape;
  BackwardParams params;
  static_cast<ForwardParams&>(params) =
      check_arguments(op, shape, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial, cu_seqlens);
  check_tensor(op, "d_out", d_out, u, {shape.values}, "the dtype of u", sizes_of(u), "u's");
  const std::string state_text = dtype_string(shape.state);
  check_tensor(op, "checkpoints", checkpoints, u, {shape.state}, state_text.c_str(),
               {shape.batch, shape.d, chunks_of(shape.length), shape.n}, "(batch, d, chunks, n)");
  if (d_last_state)
    check_tensor(op, "d_last_state", *d_last_state, u, {shape.state}, state_text.c_str(),
                 {shape.sequences, shape.d, shape.n}, "(sequences, d, n)");
  params.d_out = d_out.const_data_ptr();
  params.vectorized = params.vectorized && rows_aligned({&d_out});
  params.d_last_state = d_last_state ? d_last_state->const_data_ptr() : nullptr;
  params.saved_checkpoints = checkpoints.const_data_ptr();
  params.deterministic = deterministic;

  const auto empty = [&] { return torch::stable::new_empty(u, {0}, shape.real); };
  Tensor d_u = torch::stable::new_empty(u, sizes_of(u));
  Tensor d_delta = torch::stable::new_empty(u, sizes_of(u));
  Tensor d_z = z ? torch::stable::new_empty(u, sizes_of(u)) : empty();
  Tensor d_A = torch::stable::new_empty(u, {shape.batch, shape.d, shape.n}, shape.state);
  // Varying projections gather every channel's terms (zeroed); fixed ones each row's, as d_A.
  const auto projection_gradient = [&](const Tensor& M) {
    if (M.dim() == 2) return torch::stable::new_empty(u, {shape.batch, shape.d, shape.n}, shape.state);
    return torch::stable::new_zeros(u, sizes_of(M), shape.state);
  };
  Tensor d_B = projection_gradient(B), d_C = projection_gradient(C);
  Tensor d_D = D ? torch::stable::new_empty(u, {shape.batch, shape.d}, shape.real) : empty();
  Tensor d_delta_bias = delta_bias ? torch::stable::new_empty(u, {shape.batch, shape.d}, shape.real) : empty();
  Tensor d_initial = initial ? torch::stable::new_empty(u, {shape.sequences, shape.d, shape.n}, shape.state) : empty();
  params.d_u = d_u.mutable_data_ptr();
  params.d_delta = d_delta.mutable_data_ptr();
  params.d_z = z ? d_z.mutable_data_ptr() : nullptr;
  params.d_A = d_A.mutable_data_ptr();
  params.d_B = d_B.mutable_data_ptr();
  params.d_C = d_C.mutable_data_ptr();
  params.d_D = D ? d_D.mutable_data_ptr() : nullptr;
  params.d_delta_bias = delta_bias ? d_delta_bias.mutable_data_ptr() : nullptr;
  params.d_initial = initial ? d_initial.mutable_data_ptr() : nullptr;
  Launch(params, u);

  // The rows' partial sums, added up over the batch in a fixed order (deterministic).
  const auto over_batch = [](const Tensor& partial) {
    const std::vector<int64_t> batch_dim{0};
    return torch::stable::sum(partial, torch::headeronly::IntHeaderOnlyArrayRef(batch_dim));
  };
  const auto as_projection = [&](const Tensor& gradient, const Tensor& M) {
    return converted(M.dim() == 2 ? over_batch(gradient) : gradient, M.scalar_type());
  };
  return {d_u,
          d_delta,
          over_batch(d_A),
          as_projection(d_B, B),
          as_projection(d_C, C),
          D ? over_batch(d_D) : d_D,
          d_z,
          delta_bias ? over_batch(d_delta_bias) : d_delta_bias,
          d_initial};
}

}  // namespace ssm
}  // namespace linrec
