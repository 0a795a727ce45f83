// The standalone check's reference for the fused selective scan (check_selective_scan.cu): the CPU's
// sequential family (ssm/sequential.h) in double precision, one (batch row, channel) at a time, over
// the same params the GPU kernels take. Host-only, compiled by the host compiler (its SIMD headers).
#include "selective_scan_reference.h"

#include "linrec/ssm/sequential.h"

namespace linrec::standalone {

void reference_forward(const ssm::ForwardParams& params) {
  ssm::sequential::ForwardBuffers<double, double> buffers(params);
  for (int64_t b = 0; b < params.batch; ++b)
    for (int64_t k = 0; k < params.d; ++k) ssm::sequential::forward_row<double, double>(params, b, k, buffers);
}

void reference_backward(const ssm::BackwardParams& params) {
  ssm::sequential::BackwardBuffers<double, double> buffers(params);
  for (int64_t b = 0; b < params.batch; ++b)
    for (int64_t k = 0; k < params.d; ++k) ssm::sequential::backward_row<double, double>(params, b, k, buffers);
}

}  // namespace linrec::standalone
