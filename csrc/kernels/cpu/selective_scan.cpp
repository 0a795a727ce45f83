// The selective-scan ops on the CPU (ssm/sequential.h), spread over the intra-op pool: the forward
// one (batch row, channel) per task; the backward one run of channels per task, chosen so that the
// channels sharing a varying B or C group stay in one task, which then adds their gradient terms in
// a fixed order (deterministic, without atomics).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <numeric>

#include "linrec/dispatch.h"
#include "linrec/ssm/ops.h"
#include "linrec/ssm/sequential.h"

namespace linrec::ssm {
namespace {

// Calls body.template operator()<T, S>() for the call's element type T and state type S (real, or
// complex beside a complex A).
template <typename Body>
void dispatch_values(const ForwardParams& params, Body&& body) {
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    if constexpr (!is_complex<T>::value) {
      using R = accumulator_t<T>;
      if (is_complex_dtype(params.state_dtype)) body.template operator()<T, Complex<R>>();
      else body.template operator()<T, R>();
    }
  });
}

void forward_cpu(const ForwardParams& params, const Tensor&) {
  dispatch_values(params, [&]<typename T, typename S>() {
    torch::stable::parallel_for(0, params.batch * params.d, 1, [&](int64_t begin, int64_t end) {
      sequential::ForwardBuffers<T, S> buffers(params);
      for (int64_t row = begin; row < end; ++row)
        sequential::forward_row<T, S>(params, row / params.d, row % params.d, buffers);
    });
  });
}

// Channels per backward task: a whole number of the groups of every varying projection.
int64_t channels_per_task(const BackwardParams& params) {
  int64_t groups = params.d;
  for (const Projection* M : {&params.B, &params.C})
    if (M->varying) groups = std::gcd(groups, M->groups);
  return params.d / groups;
}

void backward_cpu(const BackwardParams& params, const Tensor&) {
  const int64_t channels = channels_per_task(params), tasks_per_row = params.d / channels;
  dispatch_values(params, [&]<typename T, typename S>() {
    torch::stable::parallel_for(0, params.batch * tasks_per_row, 1, [&](int64_t begin, int64_t end) {
      sequential::BackwardBuffers<T, S> buffers(params);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / tasks_per_row, first = task % tasks_per_row * channels;
        for (int64_t k = first; k < first + channels; ++k) sequential::backward_row<T, S>(params, b, k, buffers);
      }
    });
  });
}

}  // namespace
}  // namespace linrec::ssm

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  using namespace linrec::ssm;
  m.impl("selective_scan_forward", TORCH_BOX(&forward_op<forward_cpu>));
  m.impl("selective_scan_backward", TORCH_BOX(&backward_op<backward_cpu>));
}
