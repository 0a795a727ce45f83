// The fused selective scan on the GPU for the calls the lane family (ssm/lane_kernels.cuh) does not
// take: B or C fixed, n above 64, float64, a complex A. The state type S is real or complex; the
// per-step values (u, delta, z, out and their gradients) are real, R. One block per (batch row,
// channel) walks time in chunks of kChunk steps (its kThreads threads hold kItems consecutive steps
// each) and, for every state dim j, scans the chunk with the block-scan primitive (block_scan.h), the
// state before the chunk carried in shared memory. u, delta, z and out move between memory and registers once per chunk; B and C once
// per state dim, shared by the channels through the caches. Only the state before every chunk goes
// to memory (checkpoints), and the last state of every sequence.
//
// The backward walks the chunks from last to first: it recomputes a chunk's states from its
// checkpoint, scans the adjoint backwards (g_t = dy_t * C_t + exp(dt_{t+1} * A) * g_{t+1}, with
// the conjugates of C and the decay for a complex state) with the same primitive, the adjoint after
// the chunk carried in shared memory, and forms every gradient from the two. The shared gradients are reduced without atomics where they are per channel (A, D,
// delta_bias, fixed B and C: per-warp sums in shared memory, then per-row partials that the op layer
// adds up over the batch); varying B and C, shared by the channels of a group, are added up across
// blocks with atomic adds, through shared memory so that a warp's fall on consecutive addresses.
//
// Packed sequences (and each unpacked row) restart the state at their first step: its coefficient
// becomes 0 and its value exp(dt * A) * initial + dt * B * u, as in the linrec kernels
// (sequence_starts.h); a sequence's gradient stops there too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "linrec/block_scan.h"
#include "linrec/memio.h"
#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/params.h"
#include "linrec/ssm/step.h"

namespace linrec::ssm {

// MinBlocks: blocks an SM is to hold at least (__launch_bounds__), which caps the registers a thread takes.
template <int Threads, int Items, int MinBlocks = 1>
struct Policy {
  static constexpr int kThreads = Threads;
  static constexpr int kItems = Items;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kWarps = Threads / 32;
  static constexpr int kTile = Threads * Items;
  static_assert(kTile == kChunk, "a block's tile is a checkpoint chunk");
};

// A tile is a checkpoint chunk (kChunk = 512 steps): two warps of 8 steps a thread. The scan's
// barriers order each chunk's shared carry between them; a block of one warp has none.
using ForwardPolicy = Policy<64, 8>;
using BackwardPolicy = Policy<64, 8>;

// A time row's values of one chunk to and from registers: 16-byte accesses where every row is
// aligned for them (ForwardParams::vectorized), element by element otherwise (memio.h).
template <typename Policy>
struct ChunkIO {
  int64_t tile_begin, length;
  bool vectorized;

  template <typename T, Access Mode>
  using IO = TileIO<T, Policy::kThreads, Policy::kThreads, Policy::kItems, Mode>;

  // Neither mode stages through shared memory; TileIO asks for its (one-element) storage all the same.
  template <typename T>
  __device__ __forceinline__ static IO<T, Access::Vectorized> vector_io() {
    __shared__ typename IO<T, Access::Vectorized>::Storage unused;
    return IO<T, Access::Vectorized>(unused, threadIdx.x, 0);
  }
  template <typename T>
  __device__ __forceinline__ static IO<T, Access::Strided> element_io() {
    __shared__ typename IO<T, Access::Strided>::Storage unused;
    return IO<T, Access::Strided>(unused, threadIdx.x, 0);
  }

  template <typename T, typename S>
  __device__ __forceinline__ void load(const T* row, S (&items)[Policy::kItems], S fill) const {
    if (vectorized) vector_io<T>().fetch(row, UnitStride{}, tile_begin, length, items, fill);
    else element_io<T>().fetch(row, UnitStride{}, tile_begin, length, items, fill);
  }

  template <typename T, typename S>
  __device__ __forceinline__ void store(T* row, const S (&items)[Policy::kItems]) const {
    if (vectorized) vector_io<T>().store(row, UnitStride{}, tile_begin, length, items);
    else element_io<T>().store(row, UnitStride{}, tile_begin, length, items);
  }

  __device__ __forceinline__ int64_t step(int i) const { return tile_begin + threadIdx.x * Policy::kItems + i; }
};

// Where a thread's steps start and end sequences: bit i of `starts` / `ends` for its step i.
template <int Items>
struct Boundaries {
  uint32_t starts = 0, ends = 0;
  int64_t first_sequence = 0;  // the sequence of the thread's first step (inside the row)

  __device__ __forceinline__ Boundaries(const Sequences& sequences, int64_t b, int64_t first, int64_t length) {
    if (!sequences.packed()) {
      first_sequence = b;
      if (first == 0) starts = 1;
      if (first <= length - 1 && length - 1 < first + Items) ends = 1u << (length - 1 - first);
      return;
    }
    if (first >= length) return;
    int64_t s = first_sequence = sequences.sequence_at(first);
    #pragma unroll
    for (int i = 0; i < Items; ++i) {
      const int64_t t = first + i;
      if (t >= length) break;
      s = sequences.forward_to(s, t);
      if (sequences.boundary(s) == t) starts |= 1u << i;
      if (sequences.boundary(s + 1) - 1 == t) ends |= 1u << i;
    }
  }

  // The sequence of step t (a step of the thread's, where it starts or ends one).
  __device__ __forceinline__ int64_t sequence_of(const Sequences& sequences, int64_t t) const {
    return sequences.packed() ? sequences.forward_to(first_sequence, t) : first_sequence;
  }
};

// The state before the block's tile in the forward scan: read from shared memory by every thread,
// the state after it written back by thread 0 into the other half of a double buffer (the next
// chunk's), so that no thread reads what another is writing.
template <typename S, bool Resets>
struct SharedCarry {
  const S* read;
  S* write;
  S before;
  __device__ __forceinline__ S operator()(const Affine<S>& total) {
    before = *read;
    if (threadIdx.x == 0) *write = apply<false, S, Resets>(total, before);
    return before;
  }
};

// A prefix known beforehand: a checkpoint, or the adjoint carried into a chunk.
template <typename S>
struct FixedCarry {
  S value;
  __device__ __forceinline__ S operator()(const Affine<S>&) const { return value; }
};

// Adds a value across blocks: a complex one as its two parts.
template <typename S>
__device__ __forceinline__ void atomic_add(S* address, S value) {
  if constexpr (is_complex<S>::value) {
    atomicAdd(&address->re, value.re);
    atomicAdd(&address->im, value.im);
  } else {
    atomicAdd(address, value);
  }
}

// Adds a tile's terms (each thread's Items consecutive steps) to row[tile_begin + ...], the steps
// inside the row, across blocks. The terms pass through shared memory (`staging`, a tile of S) so that
// a warp's atomic adds fall on consecutive addresses, 16 bytes a lane for float and complex64 on
// sm_90 and newer where the row is aligned (`vectorized`). Added from the threads' own steps, a
// warp's adds would spread over 32 separate sectors, and every channel adds a full row per state dim.
template <typename Policy, typename S>
__device__ __forceinline__ void add_across_blocks(S* row, int64_t tile_begin, int64_t length,
                                                  const S (&values)[Policy::kItems], S* staging, bool vectorized) {
  constexpr int kItems = Policy::kItems;
  __syncthreads();  // the previous call's reads of the staging are done
  #pragma unroll
  for (int i = 0; i < kItems; ++i) staging[threadIdx.x * kItems + i] = values[i];
  __syncthreads();
  const int64_t left = length - tile_begin;
  row += tile_begin;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kVector = std::is_same_v<S, float> || std::is_same_v<S, Complex<float>>;
#else
  constexpr bool kVector = false;
#endif
  constexpr int kPerAdd = kVector ? 16 / sizeof(S) : 1;
  #pragma unroll
  for (int v = threadIdx.x; v < Policy::kTile / kPerAdd; v += Policy::kThreads) {
    const int first = v * kPerAdd;
    if constexpr (kVector) {
      if (vectorized && first + kPerAdd <= left) {
        atomicAdd(reinterpret_cast<float4*>(row + first), *reinterpret_cast<const float4*>(staging + first));
        continue;
      }
    }
    #pragma unroll
    for (int k = 0; k < kPerAdd; ++k)
      if (first + k < left) atomic_add(row + first + k, staging[first + k]);
  }
}

// One channel's rows of B or C: state dim j's at first + j * stride (a varying one's time row, or a fixed
// one's value), found once per block.
struct ProjectionRows {
  int64_t first, stride;

  __device__ __forceinline__ ProjectionRows(const Projection& M, int64_t b, int64_t k, const ForwardParams& p)
      : first(M.offset(b, k, 0, p.d, p.n, p.length)), stride(M.varying ? p.length : 1) {}
  __device__ __forceinline__ int64_t row(int64_t j) const { return first + j * stride; }
};

// One (batch row, channel)'s view of the operands.
template <typename T, typename W, typename S>
struct Channel {
  using R = real_t<S>;
  const ForwardParams& p;
  int64_t b, k, row;
  ProjectionRows B_rows, C_rows;

  __device__ __forceinline__ Channel(const ForwardParams& params, int64_t row_)
      : p(params), b(row_ / params.d), k(row_ % params.d), row(row_), B_rows(params.B, b, k, params),
        C_rows(params.C, b, k, params) {}

  __device__ __forceinline__ const T* values(const void* data) const { return static_cast<const T*>(data) + row * p.length; }
  __device__ __forceinline__ T* values(void* data) const { return static_cast<T*>(data) + row * p.length; }
  __device__ __forceinline__ R per_channel(const void* data) const { return data ? static_cast<const R*>(data)[k] : R(0); }
  __device__ __forceinline__ S A(int64_t j) const { return static_cast<const S*>(p.A)[k * p.n + j]; }
  __device__ __forceinline__ int64_t state_index(int64_t s, int64_t j) const { return (s * p.d + k) * p.n + j; }
  __device__ __forceinline__ S initial(int64_t s, int64_t j) const {
    return p.initial ? static_cast<const S*>(p.initial)[state_index(s, j)] : S(0);
  }

  // B or C of state dim j over the chunk's steps (fixed ones: the same value for each).
  template <typename Policy>
  __device__ __forceinline__ void projection(const Projection& M, const ProjectionRows& rows, int64_t j,
                                             const ChunkIO<Policy>& io, S (&items)[Policy::kItems]) const {
    const int64_t offset = rows.row(j);
    if (!M.varying) {
      const S value = static_cast<const S*>(M.data)[offset];
      #pragma unroll
      for (int i = 0; i < Policy::kItems; ++i) items[i] = value;
    } else {
      io.load(static_cast<const W*>(M.data) + offset, items, S(0));
    }
  }

  // The chunk's step sizes from delta (loaded into dt), and dt * u; 0 past the length, where the maps are
  // then the identity and add nothing.
  template <typename Policy>
  __device__ __forceinline__ void step_sizes(const ChunkIO<Policy>& io, R bias, R (&dt)[Policy::kItems],
                                             const R (&u)[Policy::kItems], R (&dtu)[Policy::kItems]) const {
    const int64_t left = p.length - io.step(0);
    #pragma unroll
    for (int i = 0; i < Policy::kItems; ++i) {
      dt[i] = i < left ? step_size(dt[i], bias, p.delta_softplus) : R(0);
      dtu[i] = dt[i] * u[i];
    }
  }

  // The step's map of state dim j: coeff x + value, a sequence's first step taking its initial state.
  // A2 = scaled_log2(A). Steps past the length have dt = 0 (step_sizes): the identity map.
  template <int Items>
  __device__ __forceinline__ void step_maps(const Boundaries<Items>& bounds, int64_t first, S A2, const R (&dt)[Items],
                                            const R (&dtu)[Items], const S (&B)[Items], int64_t j, S (&coeff)[Items],
                                            S (&value)[Items]) const {
    #pragma unroll
    for (int i = 0; i < Items; ++i) {
      coeff[i] = decay_from_log2(dt[i], A2);
      value[i] = dtu[i] * B[i];
    }
    if (bounds.starts) {
      #pragma unroll
      for (int i = 0; i < Items; ++i) {
        if (bounds.starts >> i & 1) {
          value[i] = coeff[i] * initial(bounds.sequence_of(p.sequences, first + i), j) + value[i];
          coeff[i] = S(0);
        }
      }
    }
  }
};

// Packed: compiled for packed sequences, whose starts inside a tile reset the state (TileScan's
// ItemResets); without, each row starts at its first step only, and the steps are plain multiply-adds.
template <typename T, typename W, typename S, typename Policy, bool Packed>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocks) forward_kernel(const ForwardParams p) {
  constexpr int kItems = Policy::kItems;
  using Scan = TileScan<32, Policy::kWarps, kItems, /*Reverse=*/false, /*Compensated=*/false, Packed, /*Alternating=*/true>;
  __shared__ typename Scan::template Storage<S> scan_storage[2];  // alternating from scan to scan
  extern __shared__ __align__(16) unsigned char dynamic_storage[];
  S* carries = reinterpret_cast<S*>(dynamic_storage);  // [2][n]: the state before this chunk and the next

  const Channel<T, W, S> ch(p, blockIdx.x);
  const int64_t n = p.n, chunks = chunks_of(p.length);
  S* last_state = static_cast<S*>(p.last_state);
  S* checkpoints = static_cast<S*>(p.checkpoints) + ch.row * chunks * n;
  for (int64_t j = threadIdx.x; j < 2 * n; j += Policy::kThreads) carries[j] = S(0);
  if (threadIdx.x == 0)
    p.sequences.for_each_empty(ch.b, [&](int64_t s) {
      for (int64_t j = 0; j < n; ++j) last_state[ch.state_index(s, j)] = ch.initial(s, j);
    });
  __syncthreads();
  using R = real_t<S>;
  const R bias = ch.per_channel(p.delta_bias), D = ch.per_channel(p.D);
  int storage_turn = 0;  // which scan storage the next scan takes: they alternate from scan to scan

  for (int64_t c = 0; c < chunks; ++c) {
    const ChunkIO<Policy> io{c * kChunk, p.length, p.vectorized};
    const int64_t first = io.step(0);
    R u[kItems], dt[kItems], dtu[kItems], y[kItems];
    io.load(ch.values(p.u), u, R(0));
    io.load(ch.values(p.delta), dt, R(0));
    ch.step_sizes(io, bias, dt, u, dtu);
    #pragma unroll
    for (int i = 0; i < kItems; ++i) y[i] = D * u[i];
    const Boundaries<kItems> bounds(p.sequences, ch.b, first, p.length);
    S* read = carries + (c & 1) * n;
    S* write = carries + ((c + 1) & 1) * n;
    for (int64_t j = 0; j < n; ++j, storage_turn ^= 1) {
      S coeff[kItems], value[kItems], M[kItems];
      ch.projection(p.B, ch.B_rows, j, io, M);
      ch.step_maps(bounds, first, scaled_log2(ch.A(j)), dt, dtu, M, j, coeff, value);
      SharedCarry<S, Packed> carry{read + j, write + j, S(0)};
      Scan::scan(value, coeff, scan_storage[storage_turn], carry);  // value[i]: the state after step i
      if (threadIdx.x == 0) checkpoints[c * n + j] = carry.before;
      ch.projection(p.C, ch.C_rows, j, io, M);
      #pragma unroll
      for (int i = 0; i < kItems; ++i) y[i] += readout(M[i] * value[i]);
      if (bounds.ends) {
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (bounds.ends >> i & 1) last_state[ch.state_index(bounds.sequence_of(p.sequences, first + i), j)] = value[i];
      }
    }
    if (p.z) {
      R z[kItems];
      io.load(ch.values(p.z), z, R(0));
      #pragma unroll
      for (int i = 0; i < kItems; ++i) y[i] *= silu(z[i]);
    }
    io.store(ch.values(p.out), y);
  }
}

template <typename T, typename W, typename S, typename Policy, bool Packed>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocks) backward_kernel(const BackwardParams p) {
  constexpr int kItems = Policy::kItems, kWarps = Policy::kWarps;
  using R = real_t<S>;
  // The two scans of a state dim alternate their storages (TileScan's Alternating).
  using ForwardScan = TileScan<32, kWarps, kItems, /*Reverse=*/false, /*Compensated=*/false, Packed, true>;
  using ReverseScan = TileScan<32, kWarps, kItems, /*Reverse=*/true, /*Compensated=*/false, Packed, true>;
  __shared__ typename ForwardScan::template Storage<S> forward_storage;
  __shared__ typename ReverseScan::template Storage<S> reverse_storage;
  __shared__ S warp_first_coeff[kWarps];  // each warp's first (conjugated) coefficient, for the warp before it
  __shared__ R block_sums[2][kWarps];
  __shared__ __align__(16) S staging[Policy::kTile];  // a varying projection's gradient terms (add_across_blocks)
  extern __shared__ __align__(16) unsigned char dynamic_storage[];
  const int64_t n = p.n, chunks = chunks_of(p.length);
  // [2][n]: the adjoint carried into this chunk and the one before (exp(dt * A) * g at the chunk's
  // first step); then per-warp sums [kWarps][n] of d_A, fixed d_B and fixed d_C.
  S* carried = reinterpret_cast<S*>(dynamic_storage);
  S* sums_A = carried + 2 * n;
  S* sums_B = sums_A + kWarps * n;
  S* sums_C = sums_B + kWarps * n;

  const Channel<T, W, S> ch(p, blockIdx.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const S* checkpoints = static_cast<const S*>(p.saved_checkpoints) + ch.row * chunks * n;
  const auto d_last = [&](int64_t s, int64_t j) {
    return p.d_last_state ? static_cast<const S*>(p.d_last_state)[ch.state_index(s, j)] : S(0);
  };
  for (int64_t j = threadIdx.x; j < (2 + 3 * kWarps) * n; j += Policy::kThreads) carried[j] = S(0);
  if (threadIdx.x == 0 && p.d_initial)
    p.sequences.for_each_empty(ch.b, [&](int64_t s) {
      for (int64_t j = 0; j < n; ++j) static_cast<S*>(p.d_initial)[ch.state_index(s, j)] = d_last(s, j);
    });
  __syncthreads();
  const R bias = ch.per_channel(p.delta_bias), D = ch.per_channel(p.D);
  R sum_D = 0, sum_delta_bias = 0;  // this thread's terms of d_D and d_delta_bias

  for (int64_t c = chunks - 1; c >= 0; --c) {
    const ChunkIO<Policy> io{c * kChunk, p.length, p.vectorized};
    const int64_t first = io.step(0);
    R u[kItems], dt[kItems], dtu[kItems], dy[kItems], y[kItems], d_u[kItems], d_dt[kItems];
    io.load(ch.values(p.u), u, R(0));
    io.load(ch.values(p.delta), dt, R(0));
    io.load(ch.values(p.d_out), dy, R(0));
    ch.step_sizes(io, bias, dt, u, dtu);
    if (p.z) {
      R z[kItems];
      io.load(ch.values(p.z), z, R(0));
      #pragma unroll
      for (int i = 0; i < kItems; ++i) dy[i] *= silu(z[i]);
    }
    #pragma unroll
    for (int i = 0; i < kItems; ++i) {
      y[i] = D * u[i];
      d_u[i] = dy[i] * D;
      d_dt[i] = R(0);
      sum_D += dy[i] * u[i];
    }
    const Boundaries<kItems> bounds(p.sequences, ch.b, first, p.length);
    const S* carried_in = carried + (c & 1) * n;
    S* carried_out = carried + ((c + 1) & 1) * n;

    for (int64_t j = 0; j < n; ++j) {
      const S A = ch.A(j), A2 = scaled_log2(A);
      S coeff[kItems], x[kItems], B[kItems], C[kItems], next[kItems], g[kItems];
      ch.projection(p.B, ch.B_rows, j, io, B);
      ch.step_maps(bounds, first, A2, dt, dtu, B, j, coeff, x);
      // next[i]: the (conjugated) coefficient through which step i's adjoint reaches back from step
      // i + 1 (0 where that step starts a sequence). The chunk's last step takes 1: the carried
      // adjoint already holds the next chunk's coefficient.
      const S first_coeff = conj(coeff[0]);
      #pragma unroll
      for (int i = 0; i + 1 < kItems; ++i) next[i] = conj(coeff[i + 1]);
      const S next_lane_first = shuffled(first_coeff, [](auto part) { return __shfl_down_sync(0xffffffffu, part, 1); });
      if (lane == 0) warp_first_coeff[warp] = first_coeff;
      FixedCarry<S> checkpoint{checkpoints[c * n + j]};
      ForwardScan::scan(x, coeff, forward_storage, checkpoint);  // synchronizes the block
      next[kItems - 1] = lane < 31 ? next_lane_first : warp + 1 < kWarps ? warp_first_coeff[warp + 1] : S(1);

      ch.projection(p.C, ch.C_rows, j, io, C);
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        y[i] += readout(C[i] * x[i]);
        g[i] = kReadoutScale<S> * dy[i] * conj(C[i]);
      }
      if (bounds.ends) {
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (bounds.ends >> i & 1) g[i] += d_last(bounds.sequence_of(p.sequences, first + i), j);
      }
      FixedCarry<S> after_chunk{carried_in[j]};
      ReverseScan::scan(g, next, reverse_storage, after_chunk);  // g[i]: the adjoint of x[i]
      if (threadIdx.x == 0) carried_out[j] = Packed ? advance(first_coeff, g[0], S(0)) : first_coeff * g[0];

      S part_A = 0, part_B = 0, part_C = 0, d_B[kItems], d_C[kItems];
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const S b_value = dtu[i] * B[i];
        // d out / d exp(dt * A), times the decay's conjugate: the state before the step is
        // (x - b_value) / exp(dt * A).
        const S d_decay = g[i] * conj(x[i] - b_value);
        const R d_input = real_dot(g[i], B[i]);  // d out / d (dt * u)
        d_u[i] += d_input * dt[i];
        d_dt[i] += d_input * u[i] + real_dot(d_decay, A);
        part_A += d_decay * dt[i];
        d_B[i] = g[i] * dtu[i];
        d_C[i] = kReadoutScale<S> * dy[i] * conj(x[i]);
        part_B += d_B[i];
        part_C += d_C[i];
      }
      if (bounds.starts && p.d_initial) {
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (bounds.starts >> i & 1)
            static_cast<S*>(p.d_initial)[ch.state_index(bounds.sequence_of(p.sequences, first + i), j)] =
                conj(decay_from_log2(dt[i], A2)) * g[i];
      }
      // Per-channel sums go to the warp's slot; a varying projection's terms, per step, across blocks.
      const auto add_to_sums = [&](S* sums, S part) {
        part = warp_sum(part);
        if (lane == 0) sums[warp * n + j] += part;
      };
      const auto add_projection_gradient = [&](const Projection& M, const ProjectionRows& rows, void* gradient,
                                               S* sums, S part, const S (&terms)[kItems]) {
        if (M.varying)
          add_across_blocks<Policy>(static_cast<S*>(gradient) + rows.row(j), io.tile_begin, p.length, terms, staging,
                                    p.vectorized);
        else add_to_sums(sums, part);
      };
      add_to_sums(sums_A, part_A);
      add_projection_gradient(p.B, ch.B_rows, p.d_B, sums_B, part_B, d_B);
      add_projection_gradient(p.C, ch.C_rows, p.d_C, sums_C, part_C, d_C);
    }

    R delta[kItems];
    io.load(ch.values(p.delta), delta, R(0));
    #pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (p.delta_softplus) d_dt[i] *= softplus_slope(delta[i] + bias);
      if (first + i < p.length) sum_delta_bias += d_dt[i];
    }
    io.store(ch.values(p.d_u), d_u);
    io.store(ch.values(p.d_delta), d_dt);
    if (p.z) {
      R z[kItems], d_out[kItems];
      io.load(ch.values(p.z), z, R(0));
      io.load(ch.values(p.d_out), d_out, R(0));
      #pragma unroll
      for (int i = 0; i < kItems; ++i) y[i] = d_out[i] * y[i] * silu_slope(z[i]);
      io.store(ch.values(p.d_z), y);
    }
  }

  // The per-row partial sums, each in a fixed order.
  sum_D = warp_sum(sum_D);
  sum_delta_bias = warp_sum(sum_delta_bias);
  if (lane == 0) {
    block_sums[0][warp] = sum_D;
    block_sums[1][warp] = sum_delta_bias;
  }
  __syncthreads();
  const auto over_warps = [&]<typename V>(const V* sums, int64_t j, int64_t stride) {
    V total = 0;
    for (int w = 0; w < kWarps; ++w) total += sums[w * stride + j];
    return total;
  };
  for (int64_t j = threadIdx.x; j < n; j += Policy::kThreads) {
    static_cast<S*>(p.d_A)[ch.row * n + j] = over_warps(sums_A, j, n);
    if (!p.B.varying) static_cast<S*>(p.d_B)[ch.row * n + j] = over_warps(sums_B, j, n);
    if (!p.C.varying) static_cast<S*>(p.d_C)[ch.row * n + j] = over_warps(sums_C, j, n);
  }
  if (threadIdx.x == 0) {
    if (p.d_D) static_cast<R*>(p.d_D)[ch.row] = over_warps(block_sums[0], 0, 1);
    if (p.d_delta_bias) static_cast<R*>(p.d_delta_bias)[ch.row] = over_warps(block_sums[1], 0, 1);
  }
}

}  // namespace linrec::ssm
