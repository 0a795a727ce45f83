// CUDA implementations of the linrec ops: device guard, current stream, arch check, launch.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>  // aoti_torch_get_current_cuda_stream (USE_CUDA)
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <optional>

#include "linrec/cuda_launch.h"
#include "linrec/ops.h"

namespace linrec {
namespace {

// Plans the call once and launches it on the stream PyTorch considers current for the tensor's
// device, so the op orders correctly with the surrounding PyTorch work (side streams, CUDA graphs). A
// plan that chains blocks gets its workspace from PyTorch's caching allocator, zeroed on the same
// stream; it is released when this returns, which the allocator orders after the kernel on that stream.
template <typename Params>
void launch_on_device_of(const Params& params, const Tensor& like) {
  const int32_t device = like.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  cuda::check_device_supported(device);
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  const Plan plan = cuda::make_plan(params);
  Params launched = params;
  std::optional<Tensor> workspace;
  if (plan.workspace_bytes > 0) {
    workspace = torch::stable::new_zeros(like, {plan.workspace_bytes}, torch::headeronly::ScalarType::Byte);
    launched.workspace = workspace->mutable_data_ptr();
  }
  cuda::launch(plan, launched, static_cast<cudaStream_t>(stream));
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<launch_on_device_of<ForwardParams>>));
  m.impl("backward", TORCH_BOX((&backward_op<launch_on_device_of<BackwardParams>, CoeffGradientSum::InKernel>)));
}
