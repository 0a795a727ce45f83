// The linrec ops' one launch path: the family a call is planned on, and the launch of its plan.
#include "linrec/cuda_launch.h"

namespace linrec::cuda {

namespace {

template <typename Params>
Plan plan_family(const Params& params) {
  if (const std::optional<Plan> bulk_plan = bulk::plan_call(params)) return *bulk_plan;
  return pipe::plan_call(params);
}

template <typename Params>
void launch_family(const Plan& plan, const Params& params, cudaStream_t stream) {
  if (plan.family == Family::Bulk) bulk::launch_plan(plan, params, stream);
  else pipe::launch_plan(plan, params, stream);
}

}  // namespace

Plan make_plan(const ForwardParams& params) { return plan_family(params); }
Plan make_plan(const BackwardParams& params) { return plan_family(params); }
void launch(const Plan& plan, const ForwardParams& params, cudaStream_t stream) { launch_family(plan, params, stream); }
void launch(const Plan& plan, const BackwardParams& params, cudaStream_t stream) { launch_family(plan, params, stream); }

}  // namespace linrec::cuda
