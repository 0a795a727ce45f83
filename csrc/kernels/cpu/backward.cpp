// The backward of the CPU kernel families (launch.h).
#include "launch.h"

#include "linrec/cpu/channel_scan.h"
#include "linrec/cpu/row_rescan.h"
#include "linrec/cpu/row_scan.h"
#include "linrec/sequential_scan.h"

namespace linrec::cpu_launch {
namespace {

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

}  // namespace

void backward(const BackwardParams& params, const Tensor&) {
  const Isa isa = cpu::cpu_isa();
  const Family family = family_of(params, {&params.d_outputs, &params.coeffs},
                                  {&params.outputs, &params.d_inputs, &params.d_coeffs}, {&params.initial, &params.d_initial});
  if (family == Family::Sequential) {
    scan_sequentially(params, [&]<int Lanes, typename T, typename C>(const int64_t(&rows)[Lanes], int64_t segment) {
      sequential_scan_backward<Lanes, T, C>(params, rows, segment);
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
        const NonfiniteFlag nonfinite;
        const BackwardRowJob<T, C, O, LogCoeffs> job{
            {params.boundary(segment), params.boundary(segment + 1), O},
            d_outputs, outputs, coeffs,
            has_initial ? initial + segment * params.initial.segment_stride : nullptr,
            params.d_outputs.time_stride == 1, params.coeffs.time_stride == 1, d_inputs, d_coeffs,
            has_initial ? d_initial + segment * params.d_initial.segment_stride : nullptr, &nonfinite};
        scan(job, A(0));
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

}  // namespace linrec::cpu_launch
