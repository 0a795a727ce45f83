// CPU implementations of the linrec ops: the sequential recurrence, parallel over sequences on
// PyTorch's intra-op thread pool, several sequences in lockstep per thread.
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

// Sequences scanned in lockstep by one thread: independent dependency chains in flight. 4 rather
// than 8: the backward reads and writes 5 rows per sequence, and 8 lanes (40 streams) ran slower
// than 4 here, likely past what the hardware prefetchers track (float32 backward 0.30 -> 0.57 of
// torch.add on 16 x 65536).
constexpr int kLanes = 4;

// Calls rows.template operator()<Lanes>(offset) for groups of kLanes consecutive sequences (and single
// ones for the rest), starting at sequence offset `offset`, spread over the thread pool in chunks of
// at least kGrainElements elements so that short sequences do not pay a task each.
template <typename Rows>
void for_each_sequence_group(const SequenceLayout& layout, const Rows& rows) {
  constexpr int64_t kGrainElements = 1 << 15;
  const int64_t grain = std::max<int64_t>(kLanes, kGrainElements / layout.seq_len);
  torch::stable::parallel_for(0, layout.num_sequences, grain, [&](int64_t begin, int64_t end) {
    int64_t seq = begin;
    for (; seq + kLanes <= end; seq += kLanes) rows.template operator()<kLanes>(seq * layout.seq_len);
    for (; seq < end; ++seq) rows.template operator()<1>(seq * layout.seq_len);
  });
}

void launch_forward_cpu(const ForwardParams& params, const Tensor&) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    const auto* inputs = static_cast<const T*>(params.inputs);
    const auto* coeffs = static_cast<const T*>(params.coeffs);
    auto* outputs = static_cast<T*>(params.outputs);
    for_each_sequence_group(params, [&]<int Lanes>(int64_t offset) {
      sequential_scan_forward<Lanes>(inputs + offset, coeffs + offset, outputs + offset, params.seq_len,
                                     params.reverse, params.seq_len);
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
    for_each_sequence_group(params, [&]<int Lanes>(int64_t offset) {
      sequential_scan_backward<Lanes>(d_outputs + offset, coeffs + offset, outputs + offset, d_inputs + offset,
                                      d_coeffs + offset, params.seq_len, params.reverse, params.seq_len);
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
