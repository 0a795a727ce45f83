// CPU implementations of the linrec ops. Each call picks one of three kernel families by layout:
//   rows:       time contiguous (time last): a vector holds consecutive steps of one sequence
//               (cpu/row_scan.h); sequences spread over the intra-op pool, or, when there are fewer
//               than threads, each split across it (cpu/blocked_sequence.h).
//   channels:   time strided, neighbouring sequences adjacent (time in the middle): a vector holds
//               neighbouring sequences (cpu/channel_scan.h).
//   sequential: anything else, and complex types: the plain recurrence over strided operands,
//               several sequences in lockstep per thread (sequential_scan.h).
// The vector kernels run on the widest instruction set the CPU has (cpu/isa.h). Every family reads
// coeffs and initial, and writes their gradients, in their own element type C: the inputs' T, or
// float32 beside 16-bit inputs (mixed precision: params.h's coeff_dtype).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <utility>

#include "linrec/cpu/blocked_sequence.h"
#include "linrec/cpu/channel_scan.h"
#include "linrec/cpu/isa.h"
#include "linrec/cpu/row_scan.h"
#include "linrec/dispatch.h"
#include "linrec/nonfinite_rescan.h"
#include "linrec/ops.h"
#include "linrec/sequential_scan.h"

namespace linrec {
namespace {

using cpu::Isa;
using cpu::Order;

// Elements a task of the pool takes at least: fewer would cost more in scheduling than they save.
constexpr int64_t kGrainElements = 1 << 15;

// Sequences scanned in lockstep by one thread of the sequential family: independent dependency
// chains in flight. 4 rather than 8: the backward reads and writes 5 rows per sequence, and 8 lanes
// (40 streams) ran slower than 4, likely past what the hardware prefetchers track.
constexpr int kLanes = 4;

enum class Family { Rows, Channels, Sequential };

bool is_real(DType dtype) { return dtype != DType::Complex64 && dtype != DType::Complex128; }

// Read operands may step by 1 or stay (stride 0: broadcast); written ones must step by 1.
bool unit_or_broadcast(int64_t stride) { return stride == 0 || stride == 1; }

// `read` and `written` operands along time (Rows) or along the innermost batch dim (Channels).
Family family_of(const SequenceLayout& layout, std::initializer_list<const Operand*> read,
                 std::initializer_list<const Operand*> written, std::initializer_list<const Operand*> states) {
  if (!is_real(layout.dtype)) return Family::Sequential;
  const auto all_of = [](auto operands, auto predicate) {
    return std::all_of(operands.begin(), operands.end(), [&](const Operand* o) { return o->data == nullptr || predicate(o); });
  };
  if (all_of(read, [](const Operand* o) { return unit_or_broadcast(o->time_stride); }) &&
      all_of(written, [](const Operand* o) { return o->time_stride == 1; }))
    return Family::Rows;
  const int inner = layout.shape.num_dims - 1;
  if (inner >= 0 && all_of(read, [&](const Operand* o) { return unit_or_broadcast(o->strides[inner]); }) &&
      all_of(written, [&](const Operand* o) { return o->strides[inner] == 1; }) &&
      all_of(states, [&](const Operand* o) { return o->strides[inner] == 1; }))
    return Family::Channels;
  return Family::Sequential;
}

// Calls body.template operator()<T, C, O, LogCoeffs>() for the params' real dtypes (T of inputs, C of
// coeffs), order and encoding.
template <typename Body>
void dispatch_real(const SequenceLayout& layout, Order order, const Body& body) {
  dispatch_dtypes<c10::Half, c10::BFloat16>(layout.dtype, layout.coeff_dtype, [&]<typename T, typename C>() {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
      const auto with_order = [&]<Order O>() {
        if (layout.log_coeffs) body.template operator()<T, C, O, true>();
        else body.template operator()<T, C, O, false>();
      };
      if (order == Order::Ascending) with_order.template operator()<Order::Ascending>();
      else with_order.template operator()<Order::Descending>();
    }
  });
}

// Scans every sequence of the rows family (numbered segment-major: sequence = segment * rows + row):
// with_job(sequence, scan) calls scan(job, state) with the sequence's blocked_sequence.h Job and
// entering state, built in place (returned by value, the job was copied through wide loads of
// narrow stores, which stalled short sequences). One sequence per task of the pool where there are
// enough of them, else each split across the pool. `fresh`: no entering state.
template <typename WithJob>
void scan_row_sequences(const SequenceLayout& layout, Isa isa, bool fresh, const WithJob& with_job) {
  const int64_t sequences = layout.num_rows() * layout.num_segments;
  const int64_t threads = torch::stable::get_num_threads();
  if (sequences < threads) {
    for (int64_t sequence = 0; sequence < sequences; ++sequence)
      with_job(sequence, [&](const auto& job, auto state) { cpu::scan_sequence_split(job, isa, threads, state, fresh); });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, layout.numel() / sequences));
  torch::stable::parallel_for(0, sequences, grain, [&](int64_t begin, int64_t end) {
    cpu::with_vector_width(isa, [&]<int Bytes>() {
      for (int64_t sequence = begin; sequence < end; ++sequence)
        with_job(sequence, [&](const auto& job, auto state) { cpu::scan_blocks<Bytes>(job, 0, job.blocks(), state, fresh); });
    });
  });
}

// The batch row and packed sequence of rows-family sequence `sequence`: without packed sequences, no
// division (two of them cost about as much as scanning a sequence of 16 steps).
std::pair<int64_t, int64_t> row_and_segment(const SequenceLayout& layout, int64_t sequence) {
  if (layout.num_segments == 1) return {sequence, 0};
  return {sequence % layout.num_rows(), sequence / layout.num_rows()};
}

// Where row `row` begins in operands of T (`values`), then in operands of C (`coeff_operands`: coeffs,
// initial and their gradients), as one tuple of pointers, from one walk over the batch dims.
template <typename T, typename C, std::size_t ValueCount, std::size_t CoeffCount>
auto row_pointers(const BatchShape& shape, int64_t row, const Operand* const (&values)[ValueCount],
                  const Operand* const (&coeff_operands)[CoeffCount]) {
  return [&]<std::size_t... V, std::size_t... K>(std::index_sequence<V...>, std::index_sequence<K...>) {
    const auto offsets = shape.row_offsets(row, *values[V]..., *coeff_operands[K]...);
    return std::tuple{values[V]->template row<T>(offsets.at[V])...,
                      coeff_operands[K]->template row<C>(offsets.at[ValueCount + K])...};
  }(std::make_index_sequence<ValueCount>(), std::make_index_sequence<CoeffCount>());
}

// The sequential family: groups of kLanes consecutive batch rows of one packed sequence (single rows
// for the rest), spread over the pool.
template <typename Scan>
void for_each_sequence_group(const SequenceLayout& layout, const Scan& scan) {
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

// The channels family: groups of neighbouring sequences along the innermost batch dim, one group per
// task of the pool: at most `max_lanes` (kChannelVectors vectors), fewer (whole vectors) where that
// would leave threads idle. Each sequence is scanned alone, so the grouping does not change results.
template <typename Scan>
void for_each_channel_group(const SequenceLayout& layout, int64_t max_lanes, int64_t vector_lanes, const Scan& scan) {
  const int64_t channels = layout.shape.sizes[layout.shape.num_dims - 1];
  const int64_t outer_rows = layout.num_rows() / channels;
  const int64_t threads = torch::stable::get_num_threads();
  int64_t lanes_per_group = max_lanes;
  while (lanes_per_group > vector_lanes && outer_rows * ((channels + lanes_per_group - 1) / lanes_per_group) < threads)
    lanes_per_group = std::max(vector_lanes, (lanes_per_group / 2 + vector_lanes - 1) / vector_lanes * vector_lanes);
  const int64_t groups_per_row = (channels + lanes_per_group - 1) / lanes_per_group;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, layout.seq_len * lanes_per_group));
  torch::stable::parallel_for(0, outer_rows * groups_per_row, grain, [&](int64_t begin, int64_t end) {
    for (int64_t group = begin; group < end; ++group) {
      const int64_t first_channel = group % groups_per_row * lanes_per_group;
      const int64_t row = group / groups_per_row * channels + first_channel;
      scan(row, static_cast<int>(std::min(lanes_per_group, channels - first_channel)));
    }
  });
}

// Lanes of one vector of A at the vector width `isa` gives.
template <typename A>
int64_t vector_lanes(Isa isa) {
  const int64_t bytes = isa == Isa::Avx512 ? 64 : isa == Isa::Avx2 ? 32 : 16;
  return bytes / static_cast<int64_t>(sizeof(A));
}

// Whether values[lo, hi) hold a non-finite value. The row kernels compose coefficients into products
// across a vector's lanes, which underflow or overflow where the loop never forms them (an Inf state
// times an underflowed product is NaN where the loop keeps +-Inf): a sequence whose results hold a
// non-finite value is scanned again by the plain recurrence from its first one (nonfinite_rescan.h).
// Read right after a span is written, while it is in cache. The channels and sequential families run
// the plain recurrence already.
template <typename T>
bool holds_nonfinite(const T* values, int64_t lo, int64_t hi) {
  bool found = false;
  for (int64_t t = lo; t < hi; ++t) found |= !is_finite(static_cast<cpu::Acc<T>>(values[t]));
  return found;
}

// Set by the spans of a sequence (several threads where it is split) that write a non-finite result.
struct NonfiniteFlag {
  mutable std::atomic<bool> found{false};
  void check(bool nonfinite) const {
    if (nonfinite) found.store(true, std::memory_order_relaxed);
  }
  explicit operator bool() const { return found.load(std::memory_order_relaxed); }
};

// One forward sequence of the rows family, as blocked_sequence.h's Job.
template <typename T, typename C, Order O, bool LogCoeffs>
struct ForwardRowJob : cpu::BlockedSpan {
  const T* inputs;
  bool inputs_unit;
  const C* coeffs;
  bool coeffs_unit;
  T* outputs;
  const NonfiniteFlag* nonfinite;

  template <int Bytes, cpu::Pass P>
  cpu::SpanMap<cpu::Acc<T>> span(int64_t lo, int64_t hi, cpu::Acc<T> state, bool fresh) const {
    const auto map = cpu::RowScan<T, C, Bytes, O, LogCoeffs>::template forward<P>(
        {inputs, inputs_unit}, {coeffs, coeffs_unit}, outputs, lo, hi, state, fresh);
    if constexpr ((P & cpu::kScan) != 0) nonfinite->check(holds_nonfinite(outputs, lo, hi));
    return map;
  }
  template <int Bytes>
  void finish(cpu::Acc<T>) const {}
};

// One backward sequence of the rows family; O is the gradient's order (against the forward's).
template <typename T, typename C, Order O, bool LogCoeffs>
struct BackwardRowJob : cpu::BlockedSpan {
  const T *d_outputs, *outputs;
  const C *coeffs, *initial;
  bool d_outputs_unit, coeffs_unit;
  T* d_inputs;
  C *d_coeffs, *d_initial;
  const NonfiniteFlag* nonfinite;

  template <int Bytes, cpu::Pass P>
  cpu::SpanMap<cpu::Acc<T>> span(int64_t span_lo, int64_t span_hi, cpu::Acc<T> state, bool fresh) const {
    const auto map = cpu::RowScan<T, C, Bytes, O, LogCoeffs>::template backward<P>(
        {d_outputs, d_outputs_unit}, {coeffs, coeffs_unit}, {outputs, true}, d_inputs, d_coeffs, lo, hi, span_lo, span_hi,
        initial, state, fresh);
    if constexpr ((P & cpu::kScan) != 0) nonfinite->check(holds_nonfinite(d_inputs, span_lo, span_hi));
    return map;
  }
  // d_initial = coeff at the forward's first step times the gradient there.
  template <int Bytes>
  void finish(cpu::Acc<T> last) const {
    if (d_initial == nullptr) return;
    using Scan = cpu::RowScan<T, C, Bytes, O, LogCoeffs>;
    const int64_t first = O == Order::Ascending ? hi - 1 : lo;
    const auto coeff = Scan::coefficient(cpu::load_splat<typename Scan::V>(coeffs + (coeffs_unit ? first : 0)))[0];
    *d_initial = static_cast<C>(coeff * last);
  }
};

void launch_forward_cpu(const ForwardParams& params, const Tensor&) {
  const Isa isa = cpu::cpu_isa();
  const Family family = family_of(params, {&params.inputs, &params.coeffs}, {&params.outputs}, {&params.initial});
  if (family == Family::Sequential) {
    dispatch_dtypes<c10::Half, c10::BFloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
      for_each_sequence_group(params, [&]<int Lanes>(const int64_t(&rows)[Lanes], int64_t segment) {
        sequential_scan_forward<Lanes, T, C>(params, rows, segment);
      });
    });
    return;
  }
  const Order order = params.reverse ? Order::Descending : Order::Ascending;
  dispatch_real(params, order, [&]<typename T, typename C, Order O, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
    if (family == Family::Rows) {
      scan_row_sequences(params, isa, !has_initial, [&](int64_t sequence, const auto& scan) {
        const auto [row, segment] = row_and_segment(params, sequence);
        const auto [inputs, outputs, coeffs, initial] =
            row_pointers<T, C>(params.shape, row, {&params.inputs, &params.outputs}, {&params.coeffs, &params.initial});
        const A state = has_initial ? static_cast<A>(initial[segment * params.initial.segment_stride]) : A(0);
        const NonfiniteFlag nonfinite;
        const ForwardRowJob<T, C, O, LogCoeffs> job{{params.boundary(segment), params.boundary(segment + 1), O},
                                                    inputs, params.inputs.time_stride == 1, coeffs,
                                                    params.coeffs.time_stride == 1, outputs, &nonfinite};
        scan(job, state);
        if (nonfinite) rescan_segment<T, C>(params, row, segment);
      });
      return;
    }
    const int inner = params.shape.num_dims - 1;
    for_each_channel_group(params, vector_lanes<A>(isa) * cpu::kChannelVectors, vector_lanes<A>(isa), [&](int64_t row, int channels) {
      const auto [inputs, outputs, coeffs, initial] =
          row_pointers<T, C>(params.shape, row, {&params.inputs, &params.outputs}, {&params.coeffs, &params.initial});
      cpu::with_vector_width(isa, [&]<int Bytes>() {
        using Scan = cpu::ChannelScan<T, C, Bytes, LogCoeffs>;
        for (int64_t segment = 0; segment < params.num_segments; ++segment)
          Scan::forward({inputs, params.inputs.time_stride, params.inputs.strides[inner] == 1},
                        {coeffs, params.coeffs.time_stride, params.coeffs.strides[inner] == 1},
                        {outputs, params.outputs.time_stride, true},
                        has_initial ? initial + segment * params.initial.segment_stride : nullptr, channels,
                        params.boundary(segment), params.boundary(segment + 1), params.reverse);
      });
    });
  });
}

void launch_backward_cpu(const BackwardParams& params, const Tensor&) {
  const Isa isa = cpu::cpu_isa();
  const Family family = family_of(params, {&params.d_outputs, &params.coeffs},
                                  {&params.outputs, &params.d_inputs, &params.d_coeffs}, {&params.initial, &params.d_initial});
  if (family == Family::Sequential) {
    dispatch_dtypes<c10::Half, c10::BFloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
      for_each_sequence_group(params, [&]<int Lanes>(const int64_t(&rows)[Lanes], int64_t segment) {
        sequential_scan_backward<Lanes, T, C>(params, rows, segment);
      });
    });
    return;
  }
  // The gradient runs against the forward's order.
  const Order order = params.reverse ? Order::Ascending : Order::Descending;
  dispatch_real(params, order, [&]<typename T, typename C, Order O, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
    if (family == Family::Rows) {
      // The gradient has no state before its first step (the forward's last).
      scan_row_sequences(params, isa, true, [&](int64_t sequence, const auto& scan) {
        const auto [row, segment] = row_and_segment(params, sequence);
        const auto [d_outputs, outputs, d_inputs, coeffs, d_coeffs, initial, d_initial] =
            row_pointers<T, C>(params.shape, row, {&params.d_outputs, &params.outputs, &params.d_inputs},
                               {&params.coeffs, &params.d_coeffs, &params.initial, &params.d_initial});
        BackwardRowJob<T, C, O, LogCoeffs> job{{params.boundary(segment), params.boundary(segment + 1), O}};
        job.d_outputs = d_outputs;
        job.coeffs = coeffs;
        job.outputs = outputs;
        job.initial = has_initial ? initial + segment * params.initial.segment_stride : nullptr;
        job.d_outputs_unit = params.d_outputs.time_stride == 1;
        job.coeffs_unit = params.coeffs.time_stride == 1;
        job.d_inputs = d_inputs;
        job.d_coeffs = d_coeffs;
        job.d_initial = has_initial ? d_initial + segment * params.d_initial.segment_stride : nullptr;
        const NonfiniteFlag nonfinite;
        job.nonfinite = &nonfinite;
        scan(job, A(0));
        if (nonfinite) rescan_segment<T, C>(params, row, segment);
      });
      return;
    }
    const int inner = params.shape.num_dims - 1;
    for_each_channel_group(params, vector_lanes<A>(isa) * cpu::kChannelVectors, vector_lanes<A>(isa), [&](int64_t row, int channels) {
      const auto [d_outputs, outputs, d_inputs, coeffs, d_coeffs, initial, d_initial] =
          row_pointers<T, C>(params.shape, row, {&params.d_outputs, &params.outputs, &params.d_inputs},
                             {&params.coeffs, &params.d_coeffs, &params.initial, &params.d_initial});
      cpu::with_vector_width(isa, [&]<int Bytes>() {
        using Scan = cpu::ChannelScan<T, C, Bytes, LogCoeffs>;
        for (int64_t segment = 0; segment < params.num_segments; ++segment)
          Scan::backward({d_outputs, params.d_outputs.time_stride, params.d_outputs.strides[inner] == 1},
                         {coeffs, params.coeffs.time_stride, params.coeffs.strides[inner] == 1},
                         {outputs, params.outputs.time_stride, true}, {d_inputs, params.d_inputs.time_stride, true},
                         {d_coeffs, params.d_coeffs.time_stride, true},
                         has_initial ? initial + segment * params.initial.segment_stride : nullptr,
                         has_initial ? d_initial + segment * params.d_initial.segment_stride : nullptr, channels,
                         params.boundary(segment), params.boundary(segment + 1), params.reverse);
      });
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
