// The bulk family's translation unit: a strided time dim with contiguous channels, on sm_90 and newer.
// Persistent blocks take chunks of 32 channels x a run of steps; the copy unit brings each chunk's
// boxes into a ring in shared memory, several chunks ahead; each chunk is scanned with lanes on
// channels and warps along time, its carry looked back at across the chunks of its channels
// (lookback.h), and its results leave through its stage of the ring, a box stored by the copy unit.
#include "linrec/bulk/plan.cuh"
#include "linrec/cuda_launch.h"

namespace linrec::cuda {

std::optional<Plan> bulk::plan_call(const ForwardParams& params) { return bulk::make_plan(params); }
std::optional<Plan> bulk::plan_call(const BackwardParams& params) { return bulk::make_plan(params); }

void bulk::launch_plan(const Plan& plan, const ForwardParams& params, cudaStream_t stream) {
  bulk::launch(plan, params, stream);
}
void bulk::launch_plan(const Plan& plan, const BackwardParams& params, cudaStream_t stream) {
  bulk::launch(plan, params, stream);
}

}  // namespace linrec::cuda
