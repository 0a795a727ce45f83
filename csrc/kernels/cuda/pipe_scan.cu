// The pipe family's translation unit: the kernels (pipe/kernels.cuh) instantiated for every compiled
// config (pipe/policy.cuh) and launched as a call's plan (pipe/plan.cuh) says. Each sequence is scanned
// by a segment of threads, tile after tile, carrying the running output between tiles (a pipe; one
// tile is the tile case). Short sequences pack several segments into one 128-thread block. Where
// there are too few sequences to fill the GPU, the tiles of a sequence go to different blocks
// instead, chained by a look-back (lookback.h). Time-contiguous rows are scanned along the row;
// layouts with time strided (channels contiguous) put a warp's lanes on neighbouring channels and
// split time over its warps. Packed sequences (cu_seqlens) are scanned as their row, reset at each
// sequence's start (sequence_starts.h), by the same kernels and configs as unpacked rows.
#include "linrec/cuda_launch.h"
#include "linrec/device_shape.h"
#include "linrec/dispatch.h"
#include "linrec/pipe/kernels.cuh"
#include "linrec/pipe/plan.cuh"

namespace linrec::cuda {

Plan pipe::plan_call(const ForwardParams& params) { return pipe::make_plan(params); }
Plan pipe::plan_call(const BackwardParams& params) { return pipe::make_plan(params); }

namespace {

// A chained plan's workspace, checked: a launch without one would read through null pointers.
void check_workspace(const Plan& plan, const SequenceLayout& layout) {
  if (plan.workspace_bytes > 0 && layout.workspace == nullptr)
    throw std::invalid_argument("linrec: the chained kernels need the workspace that their plan asks for");
}

// After a chained launch, the rescan of its flagged sequences (pipe_rescan_kernel): a block per group
// of sequences. On sm_90 and newer a programmatic dependent launch, whose launch overlaps the chained
// kernel's end (the rescan kernel waits for its completion itself): few long rows' calls read up to
// 5 % faster than with a plain launch (docs/design.md, Non-finite values).
template <typename T, typename C, PipeConfig Config, typename Params>
void launch_rescan(const Params& launched, cudaStream_t stream) {
  if constexpr (Config.schedule == Schedule::Chained) {
    const int64_t groups = pipe::PipeThread<T, C, Config, false>::chain_layout(launched).num_groups;
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(groups));
    config.blockDim = dim3(pipe::kRescanWarps * pipe::kWarp);
    config.stream = stream;
    config.attrs = &dependent;
    config.numAttrs = device_shape().major >= 9 ? 1 : 0;
    LINREC_CUDA_CHECK(cudaLaunchKernelEx(&config, pipe::pipe_rescan_kernel<T, C, pipe::Policy<Config>, Params>, launched));
  }
}

}  // namespace

void pipe::launch_plan(const Plan& plan, const ForwardParams& params, cudaStream_t stream) {
  check_workspace(plan, params);
  pipe::with_kernel_types(plan, params, [&]<typename T, typename C, PipeConfig Config>(const ForwardParams& launched) {
    pipe::pipe_forward_kernel<T, C, pipe::Policy<Config>>
        <<<static_cast<unsigned>(plan.grid_blocks), pipe::block_threads(Config), 0, stream>>>(launched);
    launch_rescan<T, C, Config>(launched, stream);
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

void pipe::launch_plan(const Plan& plan, const BackwardParams& params, cudaStream_t stream) {
  check_workspace(plan, params);
  pipe::with_kernel_types(plan, params, [&]<typename T, typename C, PipeConfig Config>(const BackwardParams& launched) {
    dispatch_value<Variant::Plain, Variant::Packed, Variant::Summing>(plan.variant, [&]<Variant Kind>() {
      if constexpr (pipe::compiled_for<T, C>(Config, Kind))
      {
        pipe::pipe_backward_kernel<T, C, pipe::Policy<Config>, Kind>
            <<<static_cast<unsigned>(plan.grid_blocks), pipe::block_threads(Config), 0, stream>>>(launched);
        launch_rescan<T, C, Config>(launched, stream);
      } else
        throw std::invalid_argument("linrec: no backward kernel is compiled for config " + describe(Config) +
                                    " with packed sequences, a summed coefficient gradient or mixed precision "
                                    "(they take the largest row tile)");
    });
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

const void* probe_kernel() {
  return reinterpret_cast<const void*>(pipe::pipe_forward_kernel<float, float, pipe::Policy<pipe::kPipeConfigs[0]>>);
}

}  // namespace linrec::cuda
