// The block family's per-block parts (ssm/blocks/policy.cuh): a chunk's rows to and from registers,
// where packed sequences start and end, the carries into a tile's scan, the adds across blocks, and
// one (batch row, channel)'s view of the operands.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "linrec/block_scan.h"
#include "linrec/memio.h"
#include "linrec/ssm/blocks/policy.cuh"
#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/step.h"

namespace linrec::ssm {

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

}  // namespace linrec::ssm
