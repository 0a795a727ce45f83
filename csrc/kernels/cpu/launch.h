// The CPU ops' launch layer: which kernel family runs a call, and how its sequences spread over the
// intra-op pool. Each call picks one of three families by layout and sequence length:
//   rows:       time contiguous (time last), sequences of kShortSequenceSteps steps or more on
//               average: a vector holds consecutive steps of one sequence (cpu/row_scan.h);
//               sequences spread over the intra-op pool, or, when there are fewer than threads, each
//               split across it (cpu/blocked_sequence.h).
//   channels:   time strided (time in the middle), or a single step, with neighbouring sequences
//               adjacent: a vector holds neighbouring sequences (cpu/channel_scan.h).
//   sequential: anything else, complex types, and shorter time-contiguous sequences: the plain
//               recurrence over strided operands, several sequences in lockstep per thread
//               (sequential_scan.h).
// The vector kernels run on the widest instruction set the CPU has (cpu/isa.h). Every family reads
// coeffs and initial, and writes their gradients, in their own element type C: the inputs' T, or
// float32 beside 16-bit inputs (mixed precision: params.h's coeff_dtype). The forward (forward.cpp)
// and the backward (backward.cpp) are separate translation units, and so is each order of the rows
// family (rows.h), compiled in parallel.
#pragma once

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
#include "linrec/cpu/isa.h"
#include "linrec/dispatch.h"
#include "linrec/ops.h"

namespace linrec::cpu_launch {

using cpu::Isa;
using cpu::Order;

// The ops' kernels (registered in linrec_cpu.cpp).
void forward(const ForwardParams& params, const Tensor& workspace);
void backward(const BackwardParams& params, const Tensor& workspace);

// The rows family in one order O of its scan (the backward's runs against the forward's), each order
// compiled in its own translation unit (rows.h, rows_ascending.cpp, rows_descending.cpp): the row
// kernels are most of the library's compile time, and the two orders then compile side by side.
template <Order O>
void forward_rows(const ForwardParams& params, Isa isa);
template <Order O>
void backward_rows(const BackwardParams& params, Isa isa);


// Elements a task of the pool takes at least: fewer would cost more in scheduling than they save.
constexpr int64_t kGrainElements = 1 << 15;

// Sequences scanned in lockstep by one thread of the sequential family: independent dependency
// chains in flight. 4 rather than 8: the backward reads and writes 5 rows per sequence, and 8 lanes
// (40 streams) ran slower than 4, likely past what the hardware prefetchers track.
constexpr int kLanes = 4;

// What starting a sequence costs the sequential family, in the steps that cost as much (float32: about
// 3 ns for its pointers and state, the time of 4 steps backward and 9 forward). A task's grain counts
// it, so that thousands of short sequences spread over the pool.
constexpr int64_t kSequenceSetupSteps = 8;

// Time-contiguous sequences shorter than this on average take the sequential family. The rows kernels
// spend a partial vector and its window scan on each sequence, about 12 ns before any step (float32,
// AVX-512 or AVX2), where 4 plain recurrences in lockstep spend about 3 ns; below 16 steps the plain
// recurrence took less time forward and backward (docs/design.md, CPU kernel).
constexpr int64_t kShortSequenceSteps = 16;

enum class Family { Rows, Channels, Sequential };

inline bool is_real(DType dtype) { return dtype != DType::Complex64 && dtype != DType::Complex128; }

// Read operands may step by 1 or stay (stride 0: broadcast); written ones must step by 1.
inline bool unit_or_broadcast(int64_t stride) { return stride == 0 || stride == 1; }

// `read` and `written` operands along time (Rows) or along the innermost batch dim (Channels).
inline Family family_of(const SequenceLayout& layout, std::initializer_list<const Operand*> read,
                 std::initializer_list<const Operand*> written, std::initializer_list<const Operand*> states) {
  if (!is_real(layout.dtype)) return Family::Sequential;
  const auto all_of = [](auto operands, auto predicate) {
    return std::all_of(operands.begin(), operands.end(), [&](const Operand* o) { return o->data == nullptr || predicate(o); });
  };
  const bool time_contiguous = all_of(read, [](const Operand* o) { return unit_or_broadcast(o->time_stride); }) &&
                               all_of(written, [](const Operand* o) { return o->time_stride == 1; });
  const int inner = layout.shape.num_dims - 1;
  const bool sequences_adjacent =
      inner >= 0 && all_of(read, [&](const Operand* o) { return unit_or_broadcast(o->strides[inner]); }) &&
      all_of(written, [&](const Operand* o) { return o->strides[inner] == 1; }) &&
      all_of(states, [&](const Operand* o) { return o->strides[inner] == 1; });
  // A single step counts as time-contiguous (ops.h); where sequences are adjacent, a vector then
  // holds neighbouring sequences rather than one step of one.
  if (sequences_adjacent && (!time_contiguous || layout.seq_len == 1)) return Family::Channels;
  if (time_contiguous && layout.seq_len >= kShortSequenceSteps * layout.num_segments) return Family::Rows;
  return Family::Sequential;
}

// Calls body.template operator()<T, C, LogCoeffs>() for the params' real dtypes (T of inputs, C of
// coeffs) and encoding.
template <typename Body>
void dispatch_real(const SequenceLayout& layout, const Body& body) {
  dispatch_dtypes<c10::Half, c10::BFloat16>(layout.dtype, layout.coeff_dtype, [&]<typename T, typename C>() {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
      if (layout.log_coeffs) body.template operator()<T, C, true>();
      else body.template operator()<T, C, false>();
    }
  });
}

// Scans every sequence of the rows family (numbered segment-major: sequence = segment * rows + row):
// with_job(sequence, scan) calls scan(job, state) with the sequence's blocked_sequence.h Job and
// entering state, built in place (returned by value, the job was copied through wide loads of
// narrow stores, which stalled short sequences). One sequence per task of the pool where there are
// enough of them, else each split across the pool. `fresh`: no entering state. Once every block of a
// sequence is scanned, job.template rescan<Bytes>() rescans it where its results hold a non-finite
// value (cpu/row_rescan.h).
template <typename WithJob>
void scan_row_sequences(const SequenceLayout& layout, Isa isa, bool fresh, const WithJob& with_job) {
  const int64_t sequences = layout.num_rows() * layout.num_segments;
  const int64_t threads = torch::stable::get_num_threads();
  if (sequences < threads) {
    for (int64_t sequence = 0; sequence < sequences; ++sequence)
      with_job(sequence, [&](const auto& job, auto state) {
        cpu::scan_sequence_split(job, isa, threads, state, fresh);
        cpu::with_vector_width(isa, [&]<int Bytes>() { job.template rescan<Bytes>(); });
      });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, layout.numel() / sequences));
  torch::stable::parallel_for(0, sequences, grain, [&](int64_t begin, int64_t end) {
    cpu::with_vector_width(isa, [&]<int Bytes>() {
      for (int64_t sequence = begin; sequence < end; ++sequence)
        with_job(sequence, [&](const auto& job, auto state) {
          cpu::scan_blocks<Bytes>(job, 0, job.blocks(), state, fresh);
          job.template rescan<Bytes>();
        });
    });
  });
}

// The batch row and packed sequence of rows-family sequence `sequence`: without packed sequences, no
// division (two of them cost about as much as scanning a sequence of 16 steps).
inline std::pair<int64_t, int64_t> row_and_segment(const SequenceLayout& layout, int64_t sequence) {
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
  const int64_t steps_per_sequence = layout.seq_len / layout.num_segments + kSequenceSetupSteps;
  const int64_t grain = std::max<int64_t>(kLanes, kGrainElements / steps_per_sequence);
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

// Runs the sequential family with the params' element types: scan.template operator()<Lanes, T, C>(rows,
// segment) for each group of for_each_sequence_group.
template <typename Scan>
void scan_sequentially(const SequenceLayout& layout, const Scan& scan) {
  dispatch_dtypes<c10::Half, c10::BFloat16>(layout.dtype, layout.coeff_dtype, [&]<typename T, typename C>() {
    for_each_sequence_group(layout, [&]<int Lanes>(const int64_t(&rows)[Lanes], int64_t segment) {
      scan.template operator()<Lanes, T, C>(rows, segment);
    });
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

// The row kernels compose coefficients into products across a vector's lanes, which underflow or
// overflow where the loop never forms them (an Inf state times an underflowed product is NaN where
// the loop keeps +-Inf): a sequence whose results hold a non-finite value (row_scan.h's
// NonfiniteWitness) is scanned again by the plain recurrence from its first one, vectors taking over
// past its first non-finite state (cpu/row_rescan.h).
// The channels and sequential families run the plain recurrence already.
// Set by the spans of a sequence (several threads where it is split) that write a non-finite result.
struct NonfiniteFlag {
  mutable std::atomic<bool> found{false};
  void check(bool nonfinite) const {
    if (nonfinite) found.store(true, std::memory_order_relaxed);
  }
  explicit operator bool() const { return found.load(std::memory_order_relaxed); }
};

}  // namespace linrec::cpu_launch
