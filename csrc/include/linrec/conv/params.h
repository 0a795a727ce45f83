// The causal depthwise convolution's parameters (linrec.causal_conv1d and its decode step): plain
// structs handed from the op layer (conv/ops.h) to the CUDA kernels (conv/kernels.cuh). Torch-free.
//
// Layouts (contiguous, unless said):
//   x, out, d_out, d_x: (batch, dim, length), element type T. x time-last (its steps contiguous, any batch and
//   channel strides: a slice of a (batch, channels, length) projection), out, d_out and d_x contiguous; or
//   channel_last: x's channels contiguous, any batch and time strides (a slice of a (batch, length, channels)
//   projection), out, d_out and d_x dense (batch, length, dim) transposed;
//   weight (dim, width), bias (dim,), initial and d_initial (sequences, dim, width - 1): R, float32, or
//   float64 beside float64 T;
//   final_states, d_final_states: (sequences, dim, width - 1) in T;
//   d_weight_partial: (batch * time_blocks, dim, width + 1) in R, each block's sums of d_weight's taps and d_bias.
// out[b, c, t] = act(bias[c] + sum_k weight[c, k] * x[b, c, t - (width - 1) + k]), the steps before a
// sequence's first reading its initial values (zeros without them).
#pragma once

#include <cstdint>

#include "linrec/params.h"
#include "linrec/ssm/params.h"  // Sequences

namespace linrec::conv {

// The widest kernel the CUDA kernels are compiled for (Mamba's are 2 to 4); wider ones take the composed path.
constexpr int kMaxWidth = 4;

// The tile kernels' block: kThreads threads, each holding items_per_thread steps of a row: 16 bytes (32 of
// float64, whose 16 bytes hold fewer than kMaxWidth - 1 steps), and for the forward on aligned rows 32 bytes,
// two 16-byte loads in flight a thread. On an H200 (API times of 8 x 5120 x 2048, width 4, SiLU) the forward
// on aligned rows took 0.56 x torch.add's time with 32 bytes against 0.40 with 16 (float32: 0.72 against
// 0.43), on odd rows (read through shared memory) 0.14 against 0.29; the backward 0.13 against 0.16 (bfloat16).
constexpr int kThreads = 128;

LINREC_HOST_DEVICE constexpr int items_per_thread(int element_bytes) {
  return element_bytes == 8 ? 4 : 16 / element_bytes;
}
static_assert(items_per_thread(8) >= kMaxWidth - 1, "a thread's left neighbour holds its halo");

// The forward's steps a thread: 32 bytes on 16-byte aligned rows, else items_per_thread.
LINREC_HOST_DEVICE constexpr int forward_items(int element_bytes, bool aligned) {
  return aligned ? 32 / element_bytes : items_per_thread(element_bytes);
}

// The threads that take a tile of a row of `length` steps, `items` a thread: the fewest, a power of two, that
// hold the row, up to kThreads (a block holds kThreads / threads tiles).
LINREC_HOST_DEVICE constexpr int segment_threads(int64_t length, int items) {
  int threads = 1;
  while (threads < kThreads && static_cast<int64_t>(threads) * items < length) threads *= 2;
  return threads;
}

// A row's tiles of segment_threads * items steps.
LINREC_HOST_DEVICE constexpr int64_t tiles_of(int64_t length, int items) {
  const int64_t tile = static_cast<int64_t>(segment_threads(length, items)) * items;
  return (length + tile - 1) / tile;
}

LINREC_HOST_DEVICE constexpr int element_bytes(DType dtype) {
  return dtype == DType::Float64 ? 8 : dtype == DType::Float32 ? 4 : 2;
}

// The channel-last kernels' block: kLanes threads along the channels (a warp, each thread holding a 16-byte
// vector of channels, or one channel) by kChunksPerBlock chunks of kChunkSteps steps.
constexpr int kLanes = 32, kChunksPerBlock = kThreads / kLanes, kChunkSteps = 32;

// A channel-last block's steps of a row: kChunksPerBlock chunks of kChunkSteps.
constexpr int64_t kGroupSteps = static_cast<int64_t>(kChunksPerBlock) * kChunkSteps;

LINREC_HOST_DEVICE constexpr int64_t groups_of(int64_t length) { return (length + kGroupSteps - 1) / kGroupSteps; }

struct ForwardParams {
  DType dtype = DType::Float32;  // T
  int64_t batch = 0, dim = 0, length = 0;
  int width = 1;
  bool silu = false;
  // Time-last: every row of x, out, d_out and d_x starts 16-byte aligned. Channel-last: every step's channels
  // of them start 16-byte aligned.
  bool vectorized = false;
  bool channel_last = false;
  // x's strides: time-last x's time stride is 1, channel-last x's channel stride.
  int64_t x_batch_stride = 0, x_channel_stride = 0, x_time_stride = 1;
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;     // null: none
  const void* initial = nullptr;  // null: zeros
  ssm::Sequences sequences;       // packed along time (batch 1), or one sequence per batch row
  void* out = nullptr;
  void* final_states = nullptr;   // null: not asked for

  // The offsets of element (b, c, t) of x, and of out (d_out, d_x).
  LINREC_HOST_DEVICE int64_t x_offset(int64_t b, int64_t c, int64_t t) const {
    return b * x_batch_stride + c * x_channel_stride + t * x_time_stride;
  }
  LINREC_HOST_DEVICE int64_t out_offset(int64_t b, int64_t c, int64_t t) const {
    return channel_last ? (b * length + t) * dim + c : (b * dim + c) * length + t;
  }
};

// The blocks along a row's time (of every batch row, the rows of d_weight_partial): time-last tiles, or
// channel-last groups of chunks.
inline int64_t time_blocks(const ForwardParams& p) {
  return p.channel_last ? groups_of(p.length) : tiles_of(p.length, items_per_thread(element_bytes(p.dtype)));
}

struct BackwardParams : ForwardParams {
  const void* d_out = nullptr;
  const void* d_final_states = nullptr;  // null: zero
  void* d_x = nullptr;
  void* d_weight_partial = nullptr;
  void* d_initial = nullptr;             // null: initial is absent
};

// The decode step: steps new inputs of every (batch row, channel) after the last width - 1 values of
// its row of state (slots, dim, state_len), which then holds the latest state_len inputs.
struct UpdateParams {
  DType dtype = DType::Float32;        // T: x and out, (batch, dim, steps)
  DType state_dtype = DType::Float32;  // T, or float32
  int64_t batch = 0, dim = 0, steps = 0, state_len = 0;
  int width = 1;
  bool silu = false;
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* state = nullptr;
  ssm::Sequences rows;  // count: slots; state_rows: int32 or int64 (batch,), or null for row b
  void* out = nullptr;
};

}  // namespace linrec::conv
