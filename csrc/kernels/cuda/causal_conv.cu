// The causal depthwise convolution's translation unit (conv/kernels.cuh): its forward, backward and
// decode step, instantiated for every element type T and width 1 to kMaxWidth, with and without packed
// sequences.
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "linrec/conv/kernels.cuh"
#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"

namespace linrec::cuda {
namespace {

// Calls body.template operator()<Width>() for the width (1 to kMaxWidth) as a compile-time value.
template <typename Body>
void dispatch_width(int width, Body&& body) {
  const bool found = [&]<int... W>(std::integer_sequence<int, W...>) {
    return ((width == W + 1 ? (body.template operator()<W + 1>(), true) : false) || ...);
  }(std::make_integer_sequence<int, conv::kMaxWidth>());
  if (!found)
    throw std::invalid_argument("linrec: causal_conv1d: no kernel is compiled for width " + std::to_string(width));
}

unsigned blocks_for(int64_t blocks, const char* what) {
  if (blocks > std::numeric_limits<int>::max())
    throw std::invalid_argument(std::string("linrec: causal_conv1d: ") + what +
                                " needs more than the 2^31 - 1 blocks a launch can have");
  return static_cast<unsigned>(blocks);
}

// The blocks of the time-last kernels: a tile of every row a segment, kThreads / segment_threads segments a block.
unsigned tile_blocks(const conv::ForwardParams& p, int items) {
  const int64_t segments_per_block = conv::kThreads / conv::segment_threads(p.length, items);
  const int64_t segments = p.batch * p.dim * conv::tiles_of(p.length, items);
  return blocks_for((segments + segments_per_block - 1) / segments_per_block, "batch * dim * tiles");
}

// The blocks of the channel-last kernels: a vector group of kLanes threads by a group of chunks, every batch row's.
template <typename T, bool Vector>
unsigned chunk_blocks(const conv::ForwardParams& p) {
  constexpr int64_t channels = conv::kLanes * conv::ChunkThread<T, Vector>::V;
  return blocks_for(p.batch * conv::groups_of(p.length) * ((p.dim + channels - 1) / channels),
                    "batch * length * dim");
}

// Calls body.template operator()<Packed, Vector>() for the call's layout: packed sequences or not, and for
// channel-last x 16-byte vectors of channels where aligned.
template <typename Body>
void dispatch_layout(const conv::ForwardParams& p, Body&& body) {
  const auto with_packed = [&]<bool Vector>() {
    if (p.sequences.packed()) body.template operator()<true, Vector>();
    else body.template operator()<false, Vector>();
  };
  if (p.channel_last && p.vectorized) with_packed.template operator()<true>();
  else with_packed.template operator()<false>();
}

unsigned thread_blocks(int64_t threads) {
  return blocks_for((threads + conv::kThreads - 1) / conv::kThreads, "the call");
}

// Calls body.template operator()<T, Width>() for the call's element type and width, where it has rows.
template <typename Body>
void dispatch_call(const conv::ForwardParams& p, Body&& body) {
  if (p.batch * p.dim == 0) return;
  dispatch_dtype<__half, __nv_bfloat16>(p.dtype, [&]<typename T>() {
    if constexpr (!is_complex<T>::value)
      dispatch_width(p.width, [&]<int Width>() { body.template operator()<T, Width>(); });
  });
}

}  // namespace

void launch(const conv::ForwardParams& p, cudaStream_t stream) {
  dispatch_call(p, [&]<typename T, int Width>() {
    if (p.length > 0) {
      dispatch_layout(p, [&]<bool Packed, bool Vector>() {
        if (p.channel_last)
          conv::forward_channel_last_kernel<T, Width, Packed, Vector>
              <<<chunk_blocks<T, Vector>(p), conv::kThreads, 0, stream>>>(p);
        else if constexpr (!Vector) {  // time-last rows: Vector is for channel-last ones
          if (p.vectorized)
            conv::forward_kernel<T, Width, Packed, true>
                <<<tile_blocks(p, conv::forward_items(sizeof(T), true)), conv::kThreads, 0, stream>>>(p);
          else
            conv::forward_kernel<T, Width, Packed, false>
                <<<tile_blocks(p, conv::forward_items(sizeof(T), false)), conv::kThreads, 0, stream>>>(p);
        }
      });
      LINREC_CUDA_CHECK(cudaGetLastError());
    }
    const int64_t finals = p.sequences.count * p.dim * (Width - 1);
    if constexpr (Width > 1) {  // a width of 1 has no final states
      if (p.final_states && finals > 0) {
        conv::final_states_kernel<T, Width><<<thread_blocks(finals), conv::kThreads, 0, stream>>>(p);
        LINREC_CUDA_CHECK(cudaGetLastError());
      }
    }
  });
}

void launch(const conv::BackwardParams& p, cudaStream_t stream) {
  dispatch_call(p, [&]<typename T, int Width>() {
    if (p.length > 0) {
      dispatch_layout(p, [&]<bool Packed, bool Vector>() {
        if (p.channel_last)
          conv::backward_channel_last_kernel<T, Width, Packed, Vector>
              <<<chunk_blocks<T, Vector>(p), conv::kThreads, 0, stream>>>(p);
        else if constexpr (!Vector)
          conv::backward_kernel<T, Width, Packed>
              <<<tile_blocks(p, conv::items_per_thread(sizeof(T))), conv::kThreads, 0, stream>>>(p);
      });
      LINREC_CUDA_CHECK(cudaGetLastError());
    }
    const int64_t channels = p.sequences.count * p.dim;
    if constexpr (Width > 1) {  // a width of 1 has no initial values
      if (p.d_initial && channels > 0) {
        conv::initial_gradient_kernel<T, Width><<<thread_blocks(channels), conv::kThreads, 0, stream>>>(p);
        LINREC_CUDA_CHECK(cudaGetLastError());
      }
    }
  });
}

void launch(const conv::UpdateParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.dim;
  if (rows == 0 || p.steps == 0) return;
  dispatch_dtype<__half, __nv_bfloat16>(p.dtype, [&]<typename T>() {
    if constexpr (!is_complex<T>::value) {
      dispatch_width(p.width, [&]<int Width>() {
        if (p.state_dtype == p.dtype)
          conv::update_kernel<T, T, Width><<<thread_blocks(rows), conv::kThreads, 0, stream>>>(p);
        else if (p.state_dtype == DType::Float32)
          conv::update_kernel<T, float, Width><<<thread_blocks(rows), conv::kThreads, 0, stream>>>(p);
        else
          throw std::invalid_argument("linrec: causal_conv1d_update: no kernel is compiled for this state dtype");
        LINREC_CUDA_CHECK(cudaGetLastError());
      });
    }
  });
}

}  // namespace linrec::cuda
