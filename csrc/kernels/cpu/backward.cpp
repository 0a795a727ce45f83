// The backward of the CPU kernel families (launch.h); the rows family's in rows.h.
#include "launch.h"

#include "linrec/cpu/channel_scan.h"
#include "linrec/sequential_scan.h"

namespace linrec::cpu_launch {

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
  if (family == Family::Rows) {  // the gradient runs against the forward's order
    if (params.reverse) backward_rows<Order::Ascending>(params, isa);
    else backward_rows<Order::Descending>(params, isa);
    return;
  }
  dispatch_real(params, [&]<typename T, typename C, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
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
