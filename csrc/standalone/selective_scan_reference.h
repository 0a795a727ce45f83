// The fused selective scan on the host in double precision (ssm/sequential.h), for the standalone
// check: params whose tensors are all double, on the host; the outputs as the GPU kernels give them
// (per-row partial sums of the shared operands' gradients, varying B's and C's summed and zeroed
// beforehand).
#pragma once

#include "linrec/ssm/params.h"

namespace linrec::standalone {

void reference_forward(const ssm::ForwardParams& params);
void reference_backward(const ssm::BackwardParams& params);

}  // namespace linrec::standalone
