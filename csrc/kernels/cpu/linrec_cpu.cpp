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
// than 4, likely past what the hardware prefetchers track (docs/design.md, CPU kernel).
constexpr int kLanes = 4;

// Calls scan.template operator()<Lanes>(rows, segment) for groups of kLanes consecutive batch rows of
// one packed sequence (and single rows for the rest), spread over the thread pool in chunks of at
// least kGrainElements elements so that short sequences do not pay a task each.
template <typename Scan>
void for_each_sequence_group(const SequenceLayout& layout, const Scan& scan) {
  constexpr int64_t kGrainElements = 1 << 15;
  const int64_t rows = layout.num_rows();
  const int64_t average_length = std::max<int64_t>(1, layout.seq_len / layout.num_segments);
  const int64_t grain = std::max<int64_t>(kLanes, kGrainElements / average_length);
  torch::stable::parallel_for(0, rows * layout.num_segments, grain, [&](int64_t begin, int64_t end) {
    int64_t sequence = begin;
    while (sequence < end) {
      const int64_t segment = sequence / rows, row = sequence % rows;
      if (row + kLanes <= rows && sequence + kLanes <= end) {
        int64_t lanes[kLanes];
        for (int k = 0; k < kLanes; ++k) lanes[k] = row + k;
        scan.template operator()<kLanes>(lanes, segment);
        sequence += kLanes;
      } else {
        const int64_t single[1] = {row};
        scan.template operator()<1>(single, segment);
        sequence += 1;
      }
    }
  });
}

void launch_forward_cpu(const ForwardParams& params, const Tensor&) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    for_each_sequence_group(params, [&]<int Lanes>(const int64_t(&rows)[Lanes], int64_t segment) {
      sequential_scan_forward<Lanes, T>(params, rows, segment);
    });
  });
}

void launch_backward_cpu(const BackwardParams& params, const Tensor&) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    for_each_sequence_group(params, [&]<int Lanes>(const int64_t(&rows)[Lanes], int64_t segment) {
      sequential_scan_backward<Lanes, T>(params, rows, segment);
    });
  });
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<launch_forward_cpu>));
  m.impl("backward", TORCH_BOX((&backward_op<launch_backward_cpu, CoeffGradientSum::AfterKernel>)));
}
