// The forward of the CPU kernel families (launch.h).
#include "launch.h"

#include "linrec/cpu/channel_scan.h"
#include "linrec/cpu/row_rescan.h"
#include "linrec/cpu/row_scan.h"
#include "linrec/sequential_scan.h"

namespace linrec::cpu_launch {
namespace {

// One forward sequence of the rows family, as blocked_sequence.h's Job.
template <typename T, typename C, Order O, bool LogCoeffs>
struct ForwardRowJob : cpu::BlockedSpan {
  const T* inputs;
  bool inputs_unit;
  const C* coeffs;
  bool coeffs_unit;
  T* outputs;
  const C* initial;  // this sequence's initial state, if any
  const NonfiniteFlag* nonfinite;

  template <int Bytes, cpu::Pass P>
  cpu::SpanMap<cpu::Acc<T>> span(int64_t lo, int64_t hi, cpu::Acc<T> state, bool fresh) const {
    const auto map = cpu::RowScan<T, C, Bytes, O, LogCoeffs>::template forward<P>(
        {inputs, inputs_unit}, {coeffs, coeffs_unit}, outputs, lo, hi, state, fresh);
    if constexpr ((P & cpu::kScan) != 0) nonfinite->check(map.nonfinite);
    return map;
  }
  template <int Bytes>
  void finish(cpu::Acc<T>) const {}
  template <int Bytes>
  void rescan() const {
    if (*nonfinite)
      cpu::RowRescan<T, C, Bytes, O, LogCoeffs>::forward({inputs, inputs_unit}, {coeffs, coeffs_unit}, outputs, lo, hi, initial);
  }
};

}  // namespace

void forward(const ForwardParams& params, const Tensor&) {
  const Isa isa = cpu::cpu_isa();
  const Family family = family_of(params, {&params.inputs, &params.coeffs}, {&params.outputs}, {&params.initial});
  if (family == Family::Sequential) {
    scan_sequentially(params, [&]<int Lanes, typename T, typename C>(const int64_t(&rows)[Lanes], int64_t segment) {
      sequential_scan_forward<Lanes, T, C>(params, rows, segment);
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
        const C* const entering = has_initial ? initial + segment * params.initial.segment_stride : nullptr;
        const A state = has_initial ? static_cast<A>(*entering) : A(0);
        const NonfiniteFlag nonfinite;
        const ForwardRowJob<T, C, O, LogCoeffs> job{{params.boundary(segment), params.boundary(segment + 1), O},
                                                    inputs, params.inputs.time_stride == 1, coeffs,
                                                    params.coeffs.time_stride == 1, outputs, entering, &nonfinite};
        scan(job, state);
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

}  // namespace linrec::cpu_launch
