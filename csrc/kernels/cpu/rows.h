// The rows family (launch.h) forward and backward in one order of its scan, instantiated for each order
// by rows_ascending.cpp and rows_descending.cpp.
#pragma once

#include "launch.h"

#include "linrec/cpu/row_rescan.h"
#include "linrec/cpu/row_scan.h"

namespace linrec::cpu_launch {
namespace rows_detail {

// One forward sequence, as blocked_sequence.h's Job.
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

// One backward sequence; O is the gradient's order (against the forward's).
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
    if constexpr ((P & cpu::kScan) != 0) nonfinite->check(map.nonfinite);
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
  template <int Bytes>
  void rescan() const {
    if (*nonfinite)
      cpu::RowRescan<T, C, Bytes, O, LogCoeffs>::backward({d_outputs, d_outputs_unit}, {coeffs, coeffs_unit}, outputs,
                                                          d_inputs, d_coeffs, lo, hi, initial, d_initial);
  }
};

}  // namespace rows_detail

template <Order O>
void forward_rows(const ForwardParams& params, Isa isa) {
  dispatch_real(params, [&]<typename T, typename C, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
    scan_row_sequences(params, isa, !has_initial, [&](int64_t sequence, const auto& scan) {
      const auto [row, segment] = row_and_segment(params, sequence);
      const auto [inputs, outputs, coeffs, initial] =
          row_pointers<T, C>(params.shape, row, {&params.inputs, &params.outputs}, {&params.coeffs, &params.initial});
      const C* const entering = has_initial ? initial + segment * params.initial.segment_stride : nullptr;
      const A state = has_initial ? static_cast<A>(*entering) : A(0);
      const NonfiniteFlag nonfinite;
      const rows_detail::ForwardRowJob<T, C, O, LogCoeffs> job{{params.boundary(segment), params.boundary(segment + 1), O},
                                                               inputs, params.inputs.time_stride == 1, coeffs,
                                                               params.coeffs.time_stride == 1, outputs, entering, &nonfinite};
      scan(job, state);
    });
  });
}

template <Order O>
void backward_rows(const BackwardParams& params, Isa isa) {
  dispatch_real(params, [&]<typename T, typename C, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
    // The gradient has no state before its first step (the forward's last).
    scan_row_sequences(params, isa, true, [&](int64_t sequence, const auto& scan) {
      const auto [row, segment] = row_and_segment(params, sequence);
      const auto [d_outputs, outputs, d_inputs, coeffs, d_coeffs, initial, d_initial] =
          row_pointers<T, C>(params.shape, row, {&params.d_outputs, &params.outputs, &params.d_inputs},
                             {&params.coeffs, &params.d_coeffs, &params.initial, &params.d_initial});
      const NonfiniteFlag nonfinite;
      const rows_detail::BackwardRowJob<T, C, O, LogCoeffs> job{
          {params.boundary(segment), params.boundary(segment + 1), O},
          d_outputs, outputs, coeffs,
          has_initial ? initial + segment * params.initial.segment_stride : nullptr,
          params.d_outputs.time_stride == 1, params.coeffs.time_stride == 1, d_inputs, d_coeffs,
          has_initial ? d_initial + segment * params.d_initial.segment_stride : nullptr, &nonfinite};
      scan(job, A(0));
    });
  });
}

}  // namespace linrec::cpu_launch
