// CUDA implementations of the linrec ops: device guard, current stream, arch check, launch.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>  // aoti_torch_get_current_cuda_stream (USE_CUDA)
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <optional>

#include "linrec/conv/ops.h"
#include "linrec/cuda_launch.h"
#include "linrec/ops.h"
#include "linrec/ssm/ops.h"

namespace linrec {
namespace {

// Calls body(stream) with `like`'s device current and the stream PyTorch considers current for it,
// so the op orders correctly with the surrounding PyTorch work (side streams, CUDA graphs).
template <typename Body>
void on_stream_of(const Tensor& like, Body&& body) {
  const int32_t device = like.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  cuda::check_device_supported(device);
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  body(static_cast<cudaStream_t>(stream));
}

// Plans the call once and launches it. A plan that asks for a workspace gets it from PyTorch's
// caching allocator, zeroed on the same stream; it is released when this returns, which the
// allocator orders after the kernel on that stream.
template <typename Params>
void launch_on_device_of(const Params& params, const Tensor& like) {
  on_stream_of(like, [&](cudaStream_t stream) {
    const auto plan = cuda::make_plan(params);
    Params launched = params;
    std::optional<Tensor> workspace;
    if (plan.workspace_bytes > 0) {
      workspace = torch::stable::new_zeros(like, {plan.workspace_bytes}, torch::headeronly::ScalarType::Byte);
      launched.workspace = workspace->mutable_data_ptr();
    }
    cuda::launch(plan, launched, stream);
  });
}

// Launches the causal convolution's kernels, which need no plan or workspace.
template <typename Params>
void launch_conv_on_device_of(const Params& params, const Tensor& like) {
  on_stream_of(like, [&](cudaStream_t stream) { cuda::launch(params, stream); });
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<launch_on_device_of<ForwardParams>>));
  m.impl("backward", TORCH_BOX((&backward_op<launch_on_device_of<BackwardParams>, CoeffGradientSum::InKernel>)));
  m.impl("selective_scan_forward", TORCH_BOX(&ssm::forward_op<launch_on_device_of<ssm::ForwardParams>>));
  m.impl("selective_scan_backward", TORCH_BOX(&ssm::backward_op<launch_on_device_of<ssm::BackwardParams>>));
  m.impl("selective_state_update",
         TORCH_BOX((&ssm::state_update_op<ssm::StateUpdateParams, launch_on_device_of<ssm::StateUpdateParams>>)));
  m.impl("causal_conv1d_forward", TORCH_BOX(&conv::forward_op<launch_conv_on_device_of<conv::ForwardParams>>));
  m.impl("causal_conv1d_backward", TORCH_BOX(&conv::backward_op<launch_conv_on_device_of<conv::BackwardParams>>));
  m.impl("causal_conv1d_update", TORCH_BOX(&conv::update_op<launch_conv_on_device_of<conv::UpdateParams>>));
}
