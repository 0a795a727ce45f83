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

// Runs launch on the stream PyTorch considers current for the tensor's device, so the op orders
// correctly with the surrounding PyTorch work (side streams, CUDA graphs). A kernel that chains
// blocks gets its workspace from PyTorch's caching allocator, zeroed on the same stream; it is
// released when this returns, which the allocator orders after the kernel on that stream.
template <typename Params>
void launch_on_device_of(const Params& params, const Tensor& like,
                         void (*launch)(const Params&, cudaStream_t)) {
  const int32_t device = like.get_device_index();
  const torch::stable::accelerator::DeviceGuard guard(device);
  cuda::check_device_supported(device);
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  Params launched = params;
  const int64_t workspace_bytes = cuda::workspace_bytes(params);
  std::optional<Tensor> workspace;
  if (workspace_bytes > 0) {
    workspace = torch::stable::new_zeros(like, {workspace_bytes}, torch::headeronly::ScalarType::Byte);
    launched.workspace = workspace->mutable_data_ptr();
  }
  launch(launched, static_cast<cudaStream_t>(stream));
}

void launch_forward_cuda(const ForwardParams& params, const Tensor& like) {
  launch_on_device_of(params, like, cuda::launch_forward);
}

void launch_backward_cuda(const BackwardParams& params, const Tensor& like) {
  launch_on_device_of(params, like, cuda::launch_backward);
}

}  // namespace
}  // namespace linrec

STABLE_TORCH_LIBRARY_IMPL(linrec, CUDA, m) {
  using namespace linrec;
  m.impl("forward", TORCH_BOX(&forward_op<launch_forward_cuda>));
  m.impl("backward", TORCH_BOX((&backward_op<launch_backward_cuda, CoeffGradientSum::InKernel>)));
}
