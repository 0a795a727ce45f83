// Host entry points of the CUDA kernels. Torch-free: the op layer and the standalone executable
// both call them with a params struct and a stream. One launch path for every op and family: plan
// the call once (make_plan), allocate the zeroed workspace the plan asks for (params.workspace), then
// launch the plan.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "linrec/conv/params.h"
#include "linrec/params.h"
#include "linrec/plan.h"
#include "linrec/ssm/params.h"

// Throws std::runtime_error naming the failed call and CUDA's description of the error.
#define LINREC_CUDA_CHECK(call)                                                                 \
  do {                                                                                          \
    const cudaError_t linrec_status_ = (call);                                                  \
    if (linrec_status_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string("linrec: CUDA error in ") + #call + ": " +          \
                               cudaGetErrorName(linrec_status_) + " (" +                      \
                               cudaGetErrorString(linrec_status_) + ")");                       \
  } while (0)

namespace linrec::cuda {

// The plan of a call on the current device: its kernel family, config, variant, grid and workspace.
Plan make_plan(const ForwardParams& params);
Plan make_plan(const BackwardParams& params);

// Launches `plan` (make_plan of these params, their workspace set) on `stream`.
void launch(const Plan& plan, const ForwardParams& params, cudaStream_t stream);
void launch(const Plan& plan, const BackwardParams& params, cudaStream_t stream);

// The families' own plans and launches, between which make_plan and launch choose (scan_launch.cu):
// the bulk family where it can take the call, else the pipe family, which takes every call.
namespace pipe {
Plan plan_call(const ForwardParams& params);
Plan plan_call(const BackwardParams& params);
void launch_plan(const Plan& plan, const ForwardParams& params, cudaStream_t stream);
void launch_plan(const Plan& plan, const BackwardParams& params, cudaStream_t stream);
}  // namespace pipe
namespace bulk {
std::optional<Plan> plan_call(const ForwardParams& params);
std::optional<Plan> plan_call(const BackwardParams& params);
void launch_plan(const Plan& plan, const ForwardParams& params, cudaStream_t stream);
void launch_plan(const Plan& plan, const BackwardParams& params, cudaStream_t stream);
}  // namespace bulk

// The fused selective scan (ssm/lanes/, ssm/blocks/), planned and launched the same way.
ssm::Plan make_plan(const ssm::ForwardParams& params);
ssm::Plan make_plan(const ssm::BackwardParams& params);
void launch(const ssm::Plan& plan, const ssm::ForwardParams& params, cudaStream_t stream);
void launch(const ssm::Plan& plan, const ssm::BackwardParams& params, cudaStream_t stream);
// Its decode step (ssm/step_kernels.cuh): no plan to make, one kernel.
ssm::Plan make_plan(const ssm::StateUpdateParams& params);
void launch(const ssm::Plan& plan, const ssm::StateUpdateParams& params, cudaStream_t stream);

// The causal depthwise convolution (conv/kernels.cuh): no plan to make, its kernels launched in order.
void launch(const conv::ForwardParams& params, cudaStream_t stream);
void launch(const conv::BackwardParams& params, cudaStream_t stream);
void launch(const conv::UpdateParams& params, cudaStream_t stream);

// Throws a clear error when `device` cannot run this build's kernels (its arch is not compiled in,
// or the driver is too old for the CUDA runtime linked into linrec).
void check_device_supported(int device);

// A kernel of this build, whose attributes tell whether the build has code for the current device.
const void* probe_kernel();

// The targets this library was compiled for, e.g. "sm_80,sm_90,sm_100,sm_120,compute_120".
const char* compiled_targets();

}  // namespace linrec::cuda
