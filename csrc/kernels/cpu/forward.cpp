// The forward of the CPU kernel families (launch.h); the rows family's in rows.h.
#include "launch.h"

#include "linrec/cpu/channel_scan.h"
#include "linrec/sequential_scan.h"

namespace linrec::cpu_launch {

void forward(const ForwardParams& params, const Tensor&) {
  const Isa isa = cpu::cpu_isa();
  const Family family = family_of(params, {&params.inputs, &params.coeffs}, {&params.outputs}, {&params.initial});
  if (family == Family::Sequential) {
    scan_sequentially(params, [&]<int Lanes, typename T, typename C>(const int64_t(&rows)[Lanes], int64_t segment) {
      sequential_scan_forward<Lanes, T, C>(params, rows, segment);
    });
    return;
  }
  if (family == Family::Rows) {
    if (params.reverse) forward_rows<Order::Descending>(params, isa);
    else forward_rows<Order::Ascending>(params, isa);
    return;
  }
  dispatch_real(params, [&]<typename T, typename C, bool LogCoeffs>() {
    using A = cpu::Acc<T>;
    const bool has_initial = params.initial.data != nullptr;
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
