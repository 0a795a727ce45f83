// The CPU kernels of the linrec ops (cpu/launch.h), registered for the CPU dispatch key.
#include <torch/csrc/stable/library.h>

#include "launch.h"

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<cpu_launch::forward>));
  m.impl("backward", TORCH_BOX((&backward_op<cpu_launch::backward, CoeffGradientSum::AfterKernel>)));
}
