// The causal depthwise convolution's CUDA kernels (parameters and layouts in conv/params.h).
//
// Time-last x: a segment of threads (a block, or for a short row a part of one) filters a tile of one
// (batch row, channel) row; each thread holds kItems consecutive steps in registers (16-byte accesses
// where the rows are aligned). The width - 1 steps before a thread's first come from its left neighbour
// through shared memory (the segment's first thread reads them), and, for the backward, the width - 1
// after its last from its right neighbour: every input is read from global memory once, so the kernels
// move what a copy moves. Channel-last x: a thread takes a 16-byte vector of channels through a chunk of
// steps in order, the width - 1 before it read again. Packed sequences: a thread finds the sequence of its first step once (a binary search of
// cu_seqlens) and steps forward through the boundaries; a tap before its sequence's first step reads
// the sequence's initial values, or zero.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "linrec/conv/params.h"
#include "linrec/memio.h"
#include "linrec/numeric.h"
#include "linrec/ssm/device_step.cuh"  // warp_sum
#include "linrec/ssm/step.h"           // silu, silu_slope

namespace linrec::conv {

template <typename T>
constexpr int kItems = items_per_thread(sizeof(T));

// items[i] = row[begin + i] as R, zeros past `length`, in 16-byte runs where `aligned`.
template <int N, typename T, typename R>
__device__ __forceinline__ void load_items(const T* row, int64_t begin, int64_t length, bool aligned, R* items) {
  constexpr int kRun = 16 / sizeof(T) < N ? 16 / static_cast<int>(sizeof(T)) : N;
  #pragma unroll
  for (int r = 0; r < N / kRun; ++r) {
    R run[kRun];
    unpack_run<kRun, T>(fetch_bits<kRun>(row, begin + r * kRun, length, aligned), run);
    #pragma unroll
    for (int i = 0; i < kRun; ++i) items[r * kRun + i] = run[i];
  }
}

template <int N, typename T, typename R>
__device__ __forceinline__ void store_items(T* row, int64_t begin, int64_t length, bool aligned, const R* items) {
  constexpr int kRun = 16 / sizeof(T) < N ? 16 / static_cast<int>(sizeof(T)) : N;
  #pragma unroll
  for (int r = 0; r < N / kRun; ++r) {
    R run[kRun];
    #pragma unroll
    for (int i = 0; i < kRun; ++i) run[i] = items[r * kRun + i];
    store_run<kRun>(row, begin + r * kRun, length, aligned, run);
  }
}

// The sequence a thread's steps belong to, advanced through the boundaries as the steps increase:
// its index (the row of initial values and final states) and its steps [start, end) of the row.
template <bool Packed>
struct SequenceCursor {
  const ssm::Sequences& sequences;
  int64_t index, start, end;

  // hint: a sequence starting at or before `first` (the block's first step's, block_sequence).
  __device__ SequenceCursor(const ssm::Sequences& sequences, int64_t b, int64_t first, int64_t hint)
      : sequences(sequences) {
    if constexpr (Packed) {
      index = hint;
      // A few boundaries one after the other (a block's steps hold few), else a binary search past them.
      for (int step = 0; step < 4 && index + 1 < sequences.count && sequences.boundary(index + 1) <= first; ++step)
        ++index;
      if (index + 1 < sequences.count && sequences.boundary(index + 1) <= first) {
        int64_t high = sequences.count;
        while (high - index > 1) {
          const int64_t middle = index + (high - index) / 2;
          if (sequences.boundary(middle) <= first) index = middle;
          else high = middle;
        }
      }
      start = sequences.boundary(index);
      end = sequences.boundary(index + 1);
    } else {
      index = b, start = 0, end = sequences.length;
    }
  }

  __device__ __forceinline__ void advance_to(int64_t t) {
    if constexpr (Packed)
      while (t >= end && index + 1 < sequences.count) start = end, end = sequences.boundary(++index + 1);
  }
};

// The packed sequence holding a block's first step `first`, found once (a binary search of cu_seqlens, whose
// loads depend on each other) and shared: the block's threads step forward from it.
template <bool Packed>
__device__ __forceinline__ int64_t block_sequence(const ssm::Sequences& sequences, int64_t first) {
  if constexpr (!Packed) {
    return 0;
  } else {
    __shared__ int64_t shared;
    if (threadIdx.x == 0) shared = sequences.sequence_at(first < sequences.length ? first : sequences.length - 1);
    __syncthreads();
    return shared;
  }
}

// The value the filter reads for channel c at step `position` before the start of sequence s: its initial value,
// or zero.
template <typename R, int Width>
__device__ __forceinline__ R initial_value(const ForwardParams& p, int64_t s, int64_t c, int64_t start, int64_t position) {
  constexpr int H = Width - 1;
  return p.initial ? static_cast<const R*>(p.initial)[(s * p.dim + c) * H + H - start + position] : R(0);
}

// The filter's operands of one channel: its taps, bias, and the initial values of its sequences.
template <typename R, int Width>
struct Channel {
  static constexpr int kHalo = Width - 1;
  R weight[Width];
  R bias;
  const R* initial;  // channel c's values of sequence 0; null: zeros
  int64_t initial_stride;

  __device__ Channel(const ForwardParams& p, int64_t c) {
    #pragma unroll
    for (int k = 0; k < Width; ++k) weight[k] = static_cast<const R*>(p.weight)[c * Width + k];
    bias = p.bias ? static_cast<const R*>(p.bias)[c] : R(0);
    initial = p.initial ? static_cast<const R*>(p.initial) + c * kHalo : nullptr;
    initial_stride = p.dim * kHalo;
  }

  // The value the filter reads at step `position` < the sequence's start: its initial value, or zero.
  __device__ __forceinline__ R before_start(int64_t sequence, int64_t start, int64_t position) const {
    return initial ? initial[sequence * initial_stride + kHalo - start + position] : R(0);
  }

  // The filter's sum at step t (window[k] holding step t - kHalo + k), before the activation.
  template <bool Packed>
  __device__ __forceinline__ R filter(const SequenceCursor<Packed>& sequence, int64_t t, const R* window) const {
    R sum = bias;
    #pragma unroll
    for (int k = 0; k < Width; ++k) {
      const int64_t position = t - kHalo + k;
      const R value = position >= sequence.start ? window[k] : before_start(sequence.index, sequence.start, position);
      sum += weight[k] * value;
    }
    return sum;
  }
};

// Whether the taps of steps first to first + steps - 1 all lie inside one sequence, after the row's start: the
// sequence of `first` starts at least width - 1 steps before it and (packed) holds the steps. Unpacked, the steps
// past the row's end are the kernels' zeros.
template <bool Packed>
__device__ __forceinline__ bool sequence_interior(const ssm::Sequences& sequences, int64_t b, int64_t first,
                                                  int64_t hint, int steps, int halo) {
  const SequenceCursor<Packed> sequence(sequences, b, first, hint);
  return sequence.start <= first - halo && (!Packed || first + steps <= sequence.end);
}

// A time-last kernel's thread: segments of `threads` threads (a power of two up to kThreads: a short row's
// fewer, several rows a block) each take a tile of a row, a thread Items consecutive steps from `first`.
template <int Items>
struct TileThread {
  int64_t row, b, c, tile, tiles, first;
  int lane, threads;  // the thread's place in its segment, and the segment's threads
  bool active;        // its segment has a row (a block's last segments may have none)

  __device__ TileThread(const ForwardParams& p) {
    threads = segment_threads(p.length, Items);
    tiles = tiles_of(p.length, Items);
    const int64_t segment = static_cast<int64_t>(blockIdx.x) * (kThreads / threads) + threadIdx.x / threads;
    lane = static_cast<int>(threadIdx.x) % threads;
    active = segment < p.batch * p.dim * tiles;
    row = active ? segment / tiles : 0;
    tile = segment % tiles;
    b = row / p.dim, c = row % p.dim;
    first = tile * threads * Items + static_cast<int64_t>(lane) * Items;
  }

  // items[0, Items) = row[first, first + Items) as R, zeros past `length` (and for an idle segment). Aligned rows:
  // 16-byte runs. Others: the segment's threads read the tile element-interleaved (coalesced whatever the
  // alignment; a thread's own run of 2-byte steps would touch a 32-byte sector with every lane of a warp), and
  // shared memory regroups the steps. Every thread of the block calls it (a uniform `aligned`).
  template <typename T, typename R>
  __device__ __forceinline__ void load(const T* row, int64_t length, bool aligned, R* items) const {
    if (aligned) return load_items<Items>(row, first, active ? length : 0, true, items);
    __shared__ R staged[kThreads * Items];
    const int base = (static_cast<int>(threadIdx.x) - lane) * Items;  // the segment's part
    const int64_t tile_first = first - static_cast<int64_t>(lane) * Items;
    #pragma unroll
    for (int j = 0; j < Items; ++j) {
      const int index = j * threads + lane;
      const int64_t step = tile_first + index;
      staged[base + index] = active && step < length ? static_cast<R>(row[step]) : R(0);
    }
    __syncthreads();
    #pragma unroll
    for (int i = 0; i < Items; ++i) items[i] = staged[base + lane * Items + i];
    __syncthreads();  // read before a next call writes them
  }

  // A sequence at or before every thread's first step: the block's first step's where the block is one
  // segment, else the first.
  template <bool Packed>
  __device__ int64_t sequence_hint(const ForwardParams& p) const {
    const int64_t block_first = threads == kThreads ? first - static_cast<int64_t>(lane) * Items : 0;
    return block_sequence<Packed>(p.sequences, block_first);
  }
};

// Fills halo[0, Count) with the Count steps before `first`, the last Count of the left neighbour's `own`
// (zeros before the row's start for a segment's first thread, which reads them).
template <int Count, int Items, typename T, typename R>
__device__ __forceinline__ void halo_from_left(const TileThread<Items>& thread, const T* row, const R* own, R* halo) {
  if constexpr (Count > 0) {
    __shared__ R tails[kThreads][Count];
    #pragma unroll
    for (int j = 0; j < Count; ++j) tails[threadIdx.x][j] = own[Items - Count + j];
    __syncthreads();
    #pragma unroll
    for (int j = 0; j < Count; ++j)
      halo[j] = thread.lane > 0 ? tails[threadIdx.x - 1][j]
                                : (thread.active ? load_one(row, 1, thread.first - Count + j, INT64_MAX, R(0)) : R(0));
    __syncthreads();  // read before a next call writes them
  }
}

// Fills halo[0, Count) with the Count steps after a thread's Items, the first Count of the right neighbour's
// `own` (zeros past `length` for a segment's last thread, which reads them).
template <int Count, int Items, typename T, typename R>
__device__ __forceinline__ void halo_from_right(const TileThread<Items>& thread, const T* row, int64_t length,
                                                const R* own, R* halo) {
  if constexpr (Count > 0) {
    __shared__ R heads[kThreads][Count];
    #pragma unroll
    for (int j = 0; j < Count; ++j) heads[threadIdx.x][j] = own[j];
    __syncthreads();
    #pragma unroll
    for (int j = 0; j < Count; ++j)
      halo[j] = thread.lane + 1 < thread.threads
                    ? heads[threadIdx.x + 1][j]
                    : (thread.active ? load_one(row, 1, thread.first + Items + j, length, R(0)) : R(0));
    __syncthreads();  // read before a next call writes them
  }
}

template <typename T, int Width, bool Packed, bool Aligned>
__global__ void __launch_bounds__(kThreads) forward_kernel(const ForwardParams p) {
  using R = accumulator_t<T>;
  constexpr int E = forward_items(sizeof(T), Aligned), H = Width - 1;
  const TileThread<E> thread(p);
  const int64_t first = thread.first;
  const T* x = static_cast<const T*>(p.x) + p.x_offset(thread.b, thread.c, 0);
  R window[H + E];  // steps first - H to first + E - 1
  thread.load(x, p.length, p.vectorized, window + H);
  // Steps before the row's start read as zeros here; the filter takes initial values for them.
  halo_from_left<H>(thread, x, window + H, window);
  const int64_t hint = thread.template sequence_hint<Packed>(p);
  if (!thread.active) return;
  const Channel<R, Width> channel(p, thread.c);
  SequenceCursor<Packed> sequence(p.sequences, thread.b, first, hint);
  R out[E];
  if (sequence.start <= first - H && (!Packed || first + E <= sequence.end)) {
    // Every tap inside one sequence (most threads): no per-tap test.
    #pragma unroll
    for (int i = 0; i < E; ++i) {
      R sum = channel.bias;
      #pragma unroll
      for (int k = 0; k < Width; ++k) sum += channel.weight[k] * window[i + k];
      out[i] = p.silu ? ssm::silu(sum) : sum;
    }
  } else {
    #pragma unroll
    for (int i = 0; i < E; ++i) {
      sequence.advance_to(first + i);
      const R sum = channel.filter(sequence, first + i, window + i);
      out[i] = p.silu ? ssm::silu(sum) : sum;
    }
  }
  store_items<E>(static_cast<T*>(p.out) + thread.row * p.length, first, p.length, p.vectorized, out);
}

// The last width - 1 inputs of every sequence (the newest of its initial values in front of a shorter
// one): a thread per (sequence, channel, slot).
template <typename T, int Width>
__global__ void __launch_bounds__(kThreads) final_states_kernel(const ForwardParams p) {
  using R = accumulator_t<T>;
  constexpr int H = Width - 1;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= p.sequences.count * p.dim * H) return;
  const int64_t s = index / (p.dim * H), c = index / H % p.dim, j = index % H;
  const bool packed = p.sequences.packed();
  const int64_t start = packed ? p.sequences.boundary(s) : 0, end = packed ? p.sequences.boundary(s + 1) : p.length;
  const int64_t position = end - H + j;
  const R value = position >= start ? static_cast<R>(static_cast<const T*>(p.x)[p.x_offset(packed ? 0 : s, c, position)])
                                    : initial_value<R, Width>(p, s, c, start, position);
  static_cast<T*>(p.final_states)[index] = static_cast<T>(value);
}

// The sum of `value` over a segment of `threads` threads (a power of two), in a fixed order, in the segment's
// first thread: within warps by shuffles, then a segment's warps' sums.
template <typename R, int Terms>
__device__ __forceinline__ void segment_sums(int threads, R (&values)[Terms]) {
  __shared__ R warp_sums[kThreads / 32][Terms];
  #pragma unroll
  for (int k = 0; k < Terms; ++k) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      if (offset < threads) values[k] += __shfl_xor_sync(0xffffffffu, values[k], offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32][k] = values[k];
  }
  __syncthreads();
  if (threads > 32 && threadIdx.x % threads == 0) {
    #pragma unroll
    for (int k = 0; k < Terms; ++k) {
      R total = R(0);
      for (int w = 0; w < threads / 32; ++w) total += warp_sums[threadIdx.x / 32 + w][k];
      values[k] = total;
    }
  }
}

// d_x, and each segment's sums of d_weight and d_bias. With g the upstream gradient through the
// activation at step t (gp[t]), d_x[u] = sum_k weight[k] * gp[u + width - 1 - k] over the steps of u's
// sequence, plus d_final_states where u is among its sequence's last width - 1.
template <typename T, int Width, bool Packed>
__global__ void __launch_bounds__(kThreads) backward_kernel(const BackwardParams p) {
  using R = accumulator_t<T>;
  constexpr int E = kItems<T>, H = Width - 1;
  const TileThread<E> thread(p);
  const int64_t first = thread.first, length = thread.active ? p.length : 0;  // an idle thread loads nothing
  const T* x = static_cast<const T*>(p.x) + p.x_offset(thread.b, thread.c, 0);
  const T* d_out = static_cast<const T*>(p.d_out) + thread.row * p.length;
  R window[H + E + H];  // x at steps first - H to first + E + H - 1
  R g[E + H];           // d_out at steps first to first + E + H - 1
  thread.load(x, p.length, p.vectorized, window + H);
  thread.load(d_out, p.length, p.vectorized, g);
  halo_from_left<H>(thread, x, window + H, window);
  halo_from_right<H>(thread, x, length, window + H, window + H + E);
  halo_from_right<H>(thread, d_out, length, g, g + E);
  const Channel<R, Width> channel(p, thread.c);

  // The gradients through the activation at steps first to first + E + H - 1 (zero past the row), and
  // the thread's terms of d_weight and d_bias (its own steps).
  R gp[E + H], sums[Width + 1] = {};  // d_weight's taps, then d_bias
  const int64_t hint = thread.template sequence_hint<Packed>(p);
  if (thread.active && sequence_interior<Packed>(p.sequences, thread.b, first, hint, E + H, H)) {
    // Every tap of steps first to first + E + H - 1 inside one sequence (most threads): no per-tap test; past
    // the row's end g is 0.
    #pragma unroll
    for (int m = 0; m < E + H; ++m) {
      R sum = channel.bias;
      #pragma unroll
      for (int k = 0; k < Width; ++k) sum += channel.weight[k] * window[m + k];
      const R gradient = p.silu ? g[m] * ssm::silu_slope(sum) : g[m];
      gp[m] = gradient;
      if (m < E) {
        #pragma unroll
        for (int k = 0; k < Width; ++k) sums[k] += gradient * window[m + k];
        sums[Width] += gradient;
      }
    }
    R d_x[E];
    #pragma unroll
    for (int i = 0; i < E; ++i) {
      R sum = R(0);
      #pragma unroll
      for (int k = 0; k < Width; ++k) sum += channel.weight[k] * gp[i + H - k];
      d_x[i] = sum;
    }
    if (p.d_final_states) {
      const SequenceCursor<Packed> own(p.sequences, thread.b, first, hint);
      const T* d_final = static_cast<const T*>(p.d_final_states);
      #pragma unroll
      for (int i = 0; i < E; ++i) {
        const int64_t u = first + i;
        if (u < own.end && u >= own.end - H)
          d_x[i] += static_cast<R>(d_final[(own.index * p.dim + thread.c) * H + u - (own.end - H)]);
      }
    }
    store_items<E>(static_cast<T*>(p.d_x) + thread.row * p.length, first, p.length, p.vectorized, d_x);
  } else if (thread.active) {
    SequenceCursor<Packed> sequence(p.sequences, thread.b, first, hint);
    #pragma unroll
    for (int m = 0; m < E + H; ++m) {
      const int64_t t = first + m;
      sequence.advance_to(t);
      R gradient = t < p.length ? g[m] : R(0);
      if (p.silu) gradient *= ssm::silu_slope(channel.filter(sequence, t, window + m));
      gp[m] = gradient;
      if (m < E) {
        #pragma unroll
        for (int k = 0; k < Width; ++k) {
          const int64_t position = t - H + k;
          const R value = position >= sequence.start ? window[m + k]
                                                     : channel.before_start(sequence.index, sequence.start, position);
          sums[k] += gradient * value;
        }
        sums[Width] += gradient;
      }
    }

    R d_x[E];
    SequenceCursor<Packed> own(p.sequences, thread.b, first, hint);
    const T* d_final = static_cast<const T*>(p.d_final_states);
    #pragma unroll
    for (int i = 0; i < E; ++i) {
      const int64_t u = first + i;
      own.advance_to(u);
      R sum = R(0);
      #pragma unroll
      for (int k = 0; k < Width; ++k)
        if (u + H - k < own.end) sum += channel.weight[k] * gp[i + H - k];
      if (d_final && u < own.end && u >= own.end - H && u >= own.start)
        sum += static_cast<R>(d_final[(own.index * p.dim + thread.c) * H + u - (own.end - H)]);
      d_x[i] = sum;
    }
    store_items<E>(static_cast<T*>(p.d_x) + thread.row * p.length, first, p.length, p.vectorized, d_x);
  }

  segment_sums(thread.threads, sums);
  if (thread.active && thread.lane == 0) {
    R* partial = static_cast<R*>(p.d_weight_partial) + ((thread.b * thread.tiles + thread.tile) * p.dim + thread.c) * (Width + 1);
    #pragma unroll
    for (int k = 0; k <= Width; ++k) partial[k] = sums[k];
  }
}

// d_initial: the taps of a sequence's first width - 1 outputs that read its initial values, and the
// final states' gradient where a sequence is shorter than width - 1 steps. A thread per (sequence, channel).
template <typename T, int Width>
__global__ void __launch_bounds__(kThreads) initial_gradient_kernel(const BackwardParams p) {
  using R = accumulator_t<T>;
  constexpr int H = Width - 1;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= p.sequences.count * p.dim) return;
  const int64_t s = index / p.dim, c = index % p.dim;
  const bool packed = p.sequences.packed();
  const int64_t start = packed ? p.sequences.boundary(s) : 0, end = packed ? p.sequences.boundary(s + 1) : p.length;
  const int64_t b = packed ? 0 : s;
  const T* x = static_cast<const T*>(p.x);
  const T* d_out = static_cast<const T*>(p.d_out);
  const Channel<R, Width> channel(p, c);
  R d_initial[H > 0 ? H : 1] = {};
  #pragma unroll
  for (int m = 0; m < H; ++m) {
    const int64_t t = start + m;
    if (t >= end) break;
    R sum = channel.bias;
    #pragma unroll
    for (int k = 0; k < Width; ++k) {
      const int64_t position = t - H + k;
      sum += channel.weight[k] * (position >= start ? static_cast<R>(x[p.x_offset(b, c, position)])
                                                    : channel.before_start(s, start, position));
    }
    R gradient = static_cast<R>(d_out[p.out_offset(b, c, t)]);
    if (p.silu) gradient *= ssm::silu_slope(sum);
    #pragma unroll
    for (int k = 0; k < H; ++k)
      if (m + k < H) d_initial[m + k] += gradient * channel.weight[k];
  }
  if (p.d_final_states) {
    const T* d_final = static_cast<const T*>(p.d_final_states) + index * H;
    #pragma unroll
    for (int j = 0; j < H; ++j) {
      const int64_t position = end - H + j;
      if (position < start) d_initial[H - start + position] += static_cast<R>(d_final[j]);
    }
  }
  #pragma unroll
  for (int j = 0; j < H; ++j) static_cast<R*>(p.d_initial)[index * H + j] = d_initial[j];
}

// ----- channel-last x: a thread per vector of channels and chunk of steps, through its steps in order -----

// The channel-last kernels' thread: V channels from c0 (a 16-byte vector, or one), the steps [t0, t1) of
// batch row b; active: it has channels and steps.
template <typename T, bool Vector>
struct ChunkThread {
  static constexpr int V = Vector ? 16 / static_cast<int>(sizeof(T)) : 1;
  int64_t b, c0, t0, t1, group;
  bool active;

  __device__ ChunkThread(const ForwardParams& p) {
    const int64_t vector_groups = (p.dim + V * kLanes - 1) / (V * kLanes), groups = groups_of(p.length);
    const int64_t vector_group = blockIdx.x % vector_groups, rest = blockIdx.x / vector_groups;
    group = rest % groups;
    b = rest / groups;
    c0 = (vector_group * kLanes + threadIdx.x % kLanes) * V;
    t0 = group * kGroupSteps + static_cast<int64_t>(threadIdx.x / kLanes) * kChunkSteps;
    t1 = t0 + kChunkSteps < p.length ? t0 + kChunkSteps : p.length;
    active = c0 < p.dim && t0 < p.length;
  }
};

// The taps and biases of V channels from c0.
template <typename R, int Width, int V>
struct VectorTaps {
  R weight[V][Width], bias[V];

  __device__ VectorTaps(const ForwardParams& p, int64_t c0) {
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      #pragma unroll
      for (int k = 0; k < Width; ++k) weight[i][k] = static_cast<const R*>(p.weight)[(c0 + i) * Width + k];
      bias[i] = p.bias ? static_cast<const R*>(p.bias)[c0 + i] : R(0);
    }
  }
};

// V consecutive elements from `at` as R: one 16-byte access for a vector (aligned), else one element.
template <int V, typename T, typename R>
__device__ __forceinline__ void load_vector(const T* at, R (&values)[V]) {
  if constexpr (V == 1) {
    values[0] = static_cast<R>(*at);
  } else {
    unpack_run<V, T>(*reinterpret_cast<const typename RunBits<V * sizeof(T)>::type*>(at), values);
  }
}

template <int V, typename T, typename R>
__device__ __forceinline__ void store_vector(T* at, const R (&values)[V]) {
  if constexpr (V == 1) {
    *at = static_cast<T>(values[0]);
  } else {
    store_run<V>(at, 0, V, true, values);
  }
}

// window[0, H) = the H steps of a thread's channels before step t0 (zeros before the row's start).
template <int H, int V, typename T, typename R>
__device__ __forceinline__ void steps_before(const T* x, int64_t t0, int64_t time_stride, R (*window)[V]) {
  #pragma unroll
  for (int j = 0; j < H; ++j) {
    const int64_t t = t0 - H + j;
    #pragma unroll
    for (int i = 0; i < V; ++i) window[j][i] = R(0);
    if (t >= 0) load_vector<V>(x + t * time_stride, window[j]);
  }
}

// Steps a channel-last thread loads before it computes on them (loads in flight).
constexpr int kStepBatch = 8;

template <typename T, int Width, bool Packed, bool Vector>
__global__ void __launch_bounds__(kThreads) forward_channel_last_kernel(const ForwardParams p) {
  using R = accumulator_t<T>;
  using Thread = ChunkThread<T, Vector>;
  constexpr int V = Thread::V, H = Width - 1;
  const Thread thread(p);
  const int64_t hint = block_sequence<Packed>(p.sequences, thread.group * kGroupSteps);
  if (!thread.active) return;
  const T* x = static_cast<const T*>(p.x) + thread.b * p.x_batch_stride + thread.c0;
  T* out = static_cast<T*>(p.out) + thread.b * p.length * p.dim + thread.c0;
  const VectorTaps<R, Width, V> taps(p, thread.c0);
  const auto& weight = taps.weight;
  const auto& bias = taps.bias;
  R window[H + kStepBatch][V];  // x at steps tb - H to tb + kStepBatch - 1
  steps_before<H>(x, thread.t0, p.x_time_stride, window);
  SequenceCursor<Packed> sequence(p.sequences, thread.b, thread.t0, hint);
  // Every tap of the chunk inside one sequence (most threads): no per-tap test.
  const bool interior = sequence.start <= thread.t0 - H && (!Packed || thread.t1 <= sequence.end);
  for (int64_t tb = thread.t0; tb < thread.t1; tb += kStepBatch) {
    #pragma unroll
    for (int j = 0; j < kStepBatch; ++j)
      if (tb + j < thread.t1) load_vector<V>(x + (tb + j) * p.x_time_stride, window[H + j]);
    #pragma unroll
    for (int j = 0; j < kStepBatch; ++j) {
      const int64_t t = tb + j;
      if (t >= thread.t1) break;
      R values[V];
      if (interior) {
        #pragma unroll
        for (int i = 0; i < V; ++i) {
          R sum = bias[i];
          #pragma unroll
          for (int k = 0; k < Width; ++k) sum += weight[i][k] * window[j + k][i];
          values[i] = p.silu ? ssm::silu(sum) : sum;
        }
      } else {
        sequence.advance_to(t);
        #pragma unroll
        for (int i = 0; i < V; ++i) {
          R sum = bias[i];
          #pragma unroll
          for (int k = 0; k < Width; ++k) {
            const int64_t position = t - H + k;
            sum += weight[i][k] * (position >= sequence.start ? window[j + k][i]
                                   : initial_value<R, Width>(p, sequence.index, thread.c0 + i, sequence.start, position));
          }
          values[i] = p.silu ? ssm::silu(sum) : sum;
        }
      }
      store_vector<V>(out + t * p.dim, values);
    }
    #pragma unroll
    for (int j = 0; j < H; ++j)
      #pragma unroll
      for (int i = 0; i < V; ++i) window[j][i] = window[kStepBatch + j][i];
  }
}

// d_x at step u of V channels from c0: sum_k weight[k] * gp[u + width - 1 - k] over the steps of u's sequence
// (ring[j] holding gp at u + j), plus d_final_states where u is among its sequence's last width - 1 steps.
template <typename R, int Width, int V, bool Packed, typename T>
__device__ __forceinline__ void input_gradient(const BackwardParams& p, const SequenceCursor<Packed>& own, int64_t u,
                                               const R (&weight)[V][Width], const R (*ring)[V], const T* d_final,
                                               int64_t c0, R (&d_x)[V]) {
  constexpr int H = Width - 1;
  #pragma unroll
  for (int i = 0; i < V; ++i) {
    R sum = R(0);
    #pragma unroll
    for (int k = 0; k < Width; ++k)
      if (u + H - k < own.end) sum += weight[i][k] * ring[H - k][i];
    if (d_final && u < own.end && u >= own.end - H)
      sum += static_cast<R>(d_final[(own.index * p.dim + c0 + i) * H + u - (own.end - H)]);
    d_x[i] = sum;
  }
}

// A channel-last block's sums of d_weight and d_bias over its chunks, in a fixed order, into its row of
// d_weight_partial.
template <typename R, int Width, int V, typename Thread>
__device__ __forceinline__ void block_sums_channel_last(const BackwardParams& p, const Thread& thread,
                                                        const R (&d_weight)[V][Width], const R (&d_bias)[V]) {
  constexpr int kTerms = V * (Width + 1);
  __shared__ R sums[kChunksPerBlock][kLanes][kTerms];
  const int lane = threadIdx.x % kLanes, chunk = threadIdx.x / kLanes;
  #pragma unroll
  for (int i = 0; i < V; ++i) {
    #pragma unroll
    for (int k = 0; k < Width; ++k) sums[chunk][lane][i * (Width + 1) + k] = d_weight[i][k];
    sums[chunk][lane][i * (Width + 1) + Width] = d_bias[i];
  }
  __syncthreads();
  if (chunk != 0 || thread.c0 >= p.dim) return;
  R* partial = static_cast<R*>(p.d_weight_partial) +
               ((thread.b * groups_of(p.length) + thread.group) * p.dim + thread.c0) * (Width + 1);
  #pragma unroll
  for (int e = 0; e < kTerms; ++e) {
    R total = R(0);
    #pragma unroll
    for (int c = 0; c < kChunksPerBlock; ++c) total += sums[c][lane][e];
    partial[e] = total;
  }
}

// As backward_kernel, for channel-last x: a thread computes gp at steps t0 to t1 + width - 2 (those past its
// chunk again computed by the next chunk's thread) and d_x at step u = t - (width - 1) once gp at t is known.
template <typename T, int Width, bool Packed, bool Vector>
__global__ void __launch_bounds__(kThreads) backward_channel_last_kernel(const BackwardParams p) {
  using R = accumulator_t<T>;
  using Thread = ChunkThread<T, Vector>;
  constexpr int V = Thread::V, H = Width - 1;
  // Fewer steps in flight for 16-bit vectors: their x, g and gp rings would spill registers.
  constexpr int kBatch = V >= 8 ? kStepBatch / 2 : kStepBatch;
  const Thread thread(p);
  const int64_t hint = block_sequence<Packed>(p.sequences, thread.group * kGroupSteps);
  R d_weight[V][Width] = {}, d_bias[V] = {};
  if (thread.active) {
    const T* x = static_cast<const T*>(p.x) + thread.b * p.x_batch_stride + thread.c0;
    const int64_t out_start = thread.b * p.length * p.dim + thread.c0;
    const T* d_out = static_cast<const T*>(p.d_out) + out_start;
    T* d_x = static_cast<T*>(p.d_x) + out_start;
    const T* d_final = static_cast<const T*>(p.d_final_states);
    const VectorTaps<R, Width, V> taps(p, thread.c0);
    const auto& weight = taps.weight;
    const auto& bias = taps.bias;
    R window[H + kBatch][V];     // x at steps tb - H to tb + kBatch - 1
    R gradients[H + kBatch][V];  // gp at the same steps
    R g[kBatch][V];
    steps_before<H>(x, thread.t0, p.x_time_stride, window);
    SequenceCursor<Packed> sequence(p.sequences, thread.b, thread.t0, hint), own(p.sequences, thread.b, thread.t0, hint);
    const int64_t end_step = thread.t1 + H;  // gp at steps past the row is 0
    for (int64_t tb = thread.t0; tb < end_step; tb += kBatch) {
      #pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        #pragma unroll
        for (int i = 0; i < V; ++i) window[H + j][i] = R(0), g[j][i] = R(0);
        if (tb + j < end_step && tb + j < p.length) {
          load_vector<V>(x + (tb + j) * p.x_time_stride, window[H + j]);
          load_vector<V>(d_out + (tb + j) * p.dim, g[j]);
        }
      }
      #pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t t = tb + j;
        if (t >= end_step) break;
        sequence.advance_to(t);
        #pragma unroll
        for (int i = 0; i < V; ++i) {
          R values[Width];
          R sum = bias[i];
          #pragma unroll
          for (int k = 0; k < Width; ++k) {
            const int64_t position = t - H + k;
            values[k] = position >= sequence.start
                            ? window[j + k][i]
                            : initial_value<R, Width>(p, sequence.index, thread.c0 + i, sequence.start, position);
            sum += weight[i][k] * values[k];
          }
          const R gradient = p.silu ? g[j][i] * ssm::silu_slope(sum) : g[j][i];
          gradients[H + j][i] = gradient;
          if (t < thread.t1) {
            #pragma unroll
            for (int k = 0; k < Width; ++k) d_weight[i][k] += gradient * values[k];
            d_bias[i] += gradient;
          }
        }
        const int64_t u = t - H;  // gp at u to u + H is known now
        if (u >= thread.t0) {
          own.advance_to(u);
          R values[V];
          input_gradient<R, Width, V>(p, own, u, weight, gradients + j, d_final, thread.c0, values);
          store_vector<V>(d_x + u * p.dim, values);
        }
      }
      #pragma unroll
      for (int j = 0; j < H; ++j)
        #pragma unroll
        for (int i = 0; i < V; ++i) window[j][i] = window[kBatch + j][i], gradients[j][i] = gradients[kBatch + j][i];
    }
  }
  block_sums_channel_last<R, Width, V>(p, thread, d_weight, d_bias);
}

// The decode step: a thread per (batch row, channel), through its steps one after the other.
template <typename T, typename S, int Width>
__global__ void __launch_bounds__(kThreads) update_kernel(const UpdateParams p) {
  using R = accumulator_t<T>;
  constexpr int H = Width - 1;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= p.batch * p.dim) return;
  const int64_t b = index / p.dim, c = index % p.dim;
  const int64_t slot = p.rows.state_row(b);  // -1: a padded batch row, from zeros, written nowhere
  S* state = static_cast<S*>(p.state) + (slot * p.dim + c) * p.state_len;
  R weight[Width], history[H > 0 ? H : 1];
  #pragma unroll
  for (int k = 0; k < Width; ++k) weight[k] = static_cast<const R*>(p.weight)[c * Width + k];
  const R bias = p.bias ? static_cast<const R*>(p.bias)[c] : R(0);
  #pragma unroll
  for (int k = 0; k < H; ++k) history[k] = slot >= 0 ? static_cast<R>(state[p.state_len - H + k]) : R(0);
  const T* x = static_cast<const T*>(p.x) + index * p.steps;
  T* out = static_cast<T*>(p.out) + index * p.steps;
  for (int64_t t = 0; t < p.steps; ++t) {
    const R input = static_cast<R>(x[t]);
    R sum = bias + weight[H] * input;
    #pragma unroll
    for (int k = 0; k < H; ++k) sum += weight[k] * history[k];
    #pragma unroll
    for (int k = 0; k + 1 < H; ++k) history[k] = history[k + 1];
    if constexpr (H > 0) history[H - 1] = input;
    out[t] = static_cast<T>(p.silu ? ssm::silu(sum) : sum);
  }
  if (slot < 0) return;
  // The latest state_len inputs, shifted in place: entry j reads entry j + steps (not yet written) or x.
  for (int64_t j = 0; j < p.state_len; ++j) {
    const int64_t source = j + p.steps;
    state[j] = source < p.state_len ? state[source] : static_cast<S>(static_cast<R>(x[source - p.state_len]));
  }
}

}  // namespace linrec::conv
