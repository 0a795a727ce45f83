// CPU implementations of the linrec ops: the sequential recurrence, parallel over sequences on
// PyTorch's intra-op thread pool.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>

#include "linrec/dispatch.h"
#include "linrec/ops.h"
#include "linrec/sequential_scan.h"

namespace linrec {
namespace {

// Calls row(offset) for the start offset of every sequence, spread over the thread pool in chunks
// of at least kGrainElements elements so short sequences do not pay a task each.
template <typename Row>
void for_each_sequence(const SequenceLayout& layout, const Row& row) {
  constexpr int64_t kGrainElements = 1 << 15;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / layout.seq_len);
  torch::stable::parallel_for(0, layout.num_sequences, grain, [&](int64_t begin, int64_t end) {
    for (int64_t seq = begin; seq < end; ++seq) row(seq * layout.seq_len);
  });
}

void launch_forward_cpu(const ForwardParams& params, const Tensor&) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    const auto* inputs = static_cast<const T*>(params.inputs);
    const auto* coeffs = static_cast<const T*>(params.coeffs);
    auto* outputs = static_cast<T*>(params.outputs);
    for_each_sequence(params, [&](int64_t offset) {
      sequential_scan_forward(inputs + offset, coeffs + offset, outputs + offset, params.seq_len,
                              params.reverse);
    });
  });
}

void launch_backward_cpu(const BackwardParams& params, const Tensor&) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    const auto* d_outputs = static_cast<const T*>(params.d_outputs);
    const auto* coeffs = static_cast<const T*>(params.coeffs);
    const auto* outputs = static_cast<const T*>(params.outputs);
    auto* d_inputs = static_cast<T*>(params.d_inputs);
    auto* d_coeffs = static_cast<T*>(params.d_coeffs);
    for_each_sequence(params, [&](int64_t offset) {
      sequential_scan_backward(d_outputs + offset, coeffs + offset, outputs + offset, d_inputs + offset,
                               d_coeffs + offset, params.seq_len, params.reverse);
    });
  });
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<launch_forward_cpu>));
  m.impl("backward", TORCH_BOX(&backward_op<launch_backward_cpu>));
}
