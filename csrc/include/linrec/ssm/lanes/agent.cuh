// The lane kernels' per-thread parts (ssm/lanes/policy.cuh): a thread's place in the grid, the tiles
// it fetches into shared memory and registers, its channel's operands and states, and the walks of a
// row through packed sequences.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "linrec/memio.h"
#include "linrec/ssm/lanes/policy.cuh"
#include "linrec/ssm/params.h"

namespace linrec::ssm::lanes {

// N floats from shared memory and back, in 16-byte accesses where N is a multiple of 4 (16-byte
// aligned rows).
template <int N>
__device__ __forceinline__ void load_floats(const float* source, float (&values)[N]) {
  if constexpr (N % 4 == 0) {
    #pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(source)[q];
      values[4 * q] = v.x, values[4 * q + 1] = v.y, values[4 * q + 2] = v.z, values[4 * q + 3] = v.w;
    }
  } else {
    #pragma unroll
    for (int i = 0; i < N; ++i) values[i] = source[i];
  }
}
template <int N>
__device__ __forceinline__ void store_floats(float* target, const float (&values)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(target) = make_float4(values[0], values[1], values[2], values[3]);
  } else {
    #pragma unroll
    for (int i = 0; i < N; ++i) target[i] = values[i];
  }
}

// A thread's place: its block's batch row and group, its channel and its state dims.
template <typename Policy>
struct Place {
  int64_t b, group, k, row;
  int64_t channel_block;  // the block's place among its group's
  int slot;    // the channel's slot in the block
  int lane;    // the thread's lane among its channel's
  bool active; // whether the slot holds a channel (the group's last block may hold fewer)

  __device__ __forceinline__ explicit Place(const ForwardParams& p) {
    const int64_t per_group = p.d / p.B.groups, blocks = blocks_per_group<Policy>(p);
    const int64_t batch_group = blockIdx.x / blocks;
    channel_block = blockIdx.x % blocks;
    group = batch_group % p.B.groups;
    b = batch_group / p.B.groups;
    slot = threadIdx.x / Policy::kLanes;
    lane = threadIdx.x % Policy::kLanes;
    const int64_t local = channel_block * Policy::kChannels + slot;
    active = local < per_group;
    k = group * per_group + (active ? local : per_group - 1);  // an idle slot reads its group's last channel
    row = b * p.d + k;
  }

  __device__ __forceinline__ int state(int i) const { return lane * Policy::kStates + i; }
  // How many of the lane's state dims lie below n (the rest are padding).
  __device__ __forceinline__ int dims_below(int64_t n) const {
    const int64_t dims = n - state(0);
    return dims <= 0 ? 0 : dims >= Policy::kStates ? Policy::kStates : static_cast<int>(dims);
  }
  // The lane's share of a tile's steps (a repeat of lane % kShareLanes's past the share lanes), and
  // whether it stores what it computes of them.
  __device__ __forceinline__ int share_offset() const { return lane % Policy::kShareLanes * Policy::kShare; }
  __device__ __forceinline__ bool stores_share() const { return lane < Policy::kShareLanes; }
  __device__ __forceinline__ int64_t share_begin(int64_t t0) const { return t0 + share_offset(); }
};

// A tile of B and C for the block's group, fetched into registers by the block's threads (runs of
// four steps of one state dim, kept as loaded until the commit so that the loads stay in flight),
// then committed to shared memory as float [B or C][step][state dim].
template <typename Policy, typename W>
struct ProjectionTile {
  static constexpr int kQuads = Policy::kSteps / 4;
  static constexpr int kRuns = 2 * Policy::kMaxStates * kQuads;
  static constexpr int kPerThread = (kRuns + Policy::kThreads - 1) / Policy::kThreads;
  using Storage = float[2][Policy::kSteps][Policy::kMaxStates];

  using Bits = typename RunBits<4 * sizeof(W)>::type;
  Bits values[kPerThread];

  __device__ __forceinline__ static bool run_of(int i, int& which, int& quad, int& j) {
    const int run = threadIdx.x + i * Policy::kThreads;
    j = run % Policy::kMaxStates;
    quad = run / Policy::kMaxStates % kQuads;
    which = run / (Policy::kMaxStates * kQuads);
    return run < kRuns;
  }

  // C may be null: its runs are then zeros.
  __device__ __forceinline__ void fetch(const W* B, const W* C, int64_t n, int64_t t0, int64_t length, bool aligned) {
    #pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      int which, quad, j;
      const bool present = run_of(i, which, quad, j) && j < n && (which == 0 || C);
      values[i] = fetch_bits<4>((which ? C : B) + j * length, t0 + 4 * quad, present ? length : 0, aligned);
    }
  }

  __device__ __forceinline__ void commit(Storage& tile) const {
    #pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      int which, quad, j;
      if (!run_of(i, which, quad, j)) continue;
      float items[4];
      unpack_run<4, W>(values[i], items);
      #pragma unroll
      for (int e = 0; e < 4; ++e) tile[which][4 * quad + e][j] = items[e];
    }
  }
};

// A lane's steps of its channel's time rows (its kShare of a tile), fetched as stored, one tile ahead.
template <typename T, int Share, int Rows>
struct ShareRuns {
  using Bits = typename RunBits<Share * sizeof(T)>::type;
  Bits next[Rows];

  // A null row's runs are zeros.
  __device__ __forceinline__ void fetch(int row, const T* data, int64_t begin, int64_t length, bool aligned) {
    next[row] = fetch_bits<Share>(data, begin, data ? length : 0, aligned);
  }
  __device__ __forceinline__ void unpack(int row, float (&items)[Share]) const { unpack_run<Share, T>(next[row], items); }
};

// One channel's operands and per-sequence states, as a lane sees them.
template <typename Policy>
struct ChannelView {
  const ForwardParams& p;
  const Place<Policy>& at;

  __device__ __forceinline__ int64_t state_index(int64_t s, int j) const { return (s * p.d + at.k) * p.n + j; }
  __device__ __forceinline__ float per_channel(const void* data) const {
    return data ? static_cast<const float*>(data)[at.k] : 0.0f;
  }
  // The lane's state dims of sequence s from a (sequences, d, n) tensor (0 where absent, past n, or of
  // no sequence: s = -1).
  __device__ __forceinline__ void read_states(const void* states, int64_t s, float (&h)[Policy::kStates]) const {
    #pragma unroll
    for (int i = 0; i < Policy::kStates; ++i) {
      const int j = at.state(i);
      h[i] = states && s >= 0 && j < p.n ? static_cast<const float*>(states)[state_index(s, j)] : 0.0f;
    }
  }
  // Writes the lane's state dims of sequence s (an active channel's) into a (sequences, d, n) tensor.
  __device__ __forceinline__ void write_states(void* states, int64_t s, const float (&h)[Policy::kStates]) const {
    if (!at.active || !states) return;
    #pragma unroll
    for (int i = 0; i < Policy::kStates; ++i)
      if (at.state(i) < p.n) static_cast<float*>(states)[state_index(s, at.state(i))] = h[i];
  }
  // The lane's state dims of the channel's row of a (d, n) tensor: A, or a fixed B or C (0 past n).
  __device__ __forceinline__ void read_dims(const void* data, float (&values)[Policy::kStates]) const {
    #pragma unroll
    for (int i = 0; i < Policy::kStates; ++i)
      values[i] = at.state(i) < p.n ? static_cast<const float*>(data)[at.k * p.n + at.state(i)] : 0.0f;
  }
  // For the sequences without steps that batch row b's blocks set: to[s] = from[s] (an empty sequence
  // ends in its initial state, whose gradient is then its last state's).
  __device__ __forceinline__ void copy_empty_sequences(const void* from, void* to) const {
    p.sequences.for_each_empty(at.b, [&](int64_t s) {
      float h[Policy::kStates];
      read_states(from, s, h);
      write_states(to, s, h);
    });
  }
  // The first step of the sequence after s (the next non-empty one's start), or none (INT64_MAX).
  __device__ __forceinline__ int64_t next_start(int64_t s) const {
    const Sequences& q = p.sequences;
    if (s + 1 >= q.count) return INT64_MAX;
    const int64_t start = q.boundary(s + 1);
    return start < p.length ? start : INT64_MAX;
  }
};

// The forward walk of a row's states through packed sequences: the sequence of the current step, and
// the step at which the next one starts (where the state restarts from that sequence's initial state).
template <bool Packed>
struct ForwardWalk {
  int64_t sequence = 0, restart = INT64_MAX;

  // The walk from the state before step t0 (as saved: before any restart at t0). Where a sequence
  // starts at t0, the walk begins in the one before, which the restart ends (none before step 0: -1).
  template <typename Policy>
  __device__ __forceinline__ ForwardWalk(const ChannelView<Policy>& ch, int64_t t0) {
    if constexpr (Packed) {
      if (t0 >= ch.p.length) return;
      sequence = ch.p.sequences.sequence_at(t0);
      if (ch.p.sequences.boundary(sequence) == t0) {
        restart = t0;
        sequence = t0 > 0 ? ch.p.sequences.sequence_at(t0 - 1) : -1;
      } else {
        restart = ch.next_start(sequence);
      }
    } else {
      sequence = ch.at.b;
    }
  }

  // Before step t: restarts the state where a sequence starts, calling ended(s, h) with the state the
  // sequence before it ended in.
  template <typename Policy, typename Ended>
  __device__ __forceinline__ void before_step(const ChannelView<Policy>& ch, int64_t t, float (&h)[Policy::kStates],
                                              Ended&& ended) {
    if constexpr (Packed) {
      if (t == restart) {
        if (sequence >= 0) ended(sequence, h);
        sequence = ch.p.sequences.forward_to(sequence, t);
        restart = ch.next_start(sequence);
        ch.read_states(ch.p.initial, sequence, h);
      }
    }
  }
};

// The backward walk of a row's adjoint through packed sequences: the sequence of the current step and
// its first step, from the segment's last step.
template <bool Packed>
struct ReverseWalk {
  const void* d_last_state;  // (sequences, d, n), or null
  int64_t sequence, first_step = 0;

  template <typename Policy>
  __device__ __forceinline__ ReverseWalk(const ChannelView<Policy>& ch, const void* d_last_state_, int64_t begin,
                                         int64_t end)
      : d_last_state(d_last_state_), sequence(ch.at.b) {
    if constexpr (Packed) {
      if (end > begin) {
        sequence = ch.p.sequences.sequence_at(end - 1);
        first_step = ch.p.sequences.boundary(sequence);
      }
    }
  }

  // Before step t, walking back: where t ends the sequence before, the adjoint carried back becomes
  // that sequence's last-state gradient; returns whether it did.
  template <typename Policy>
  __device__ __forceinline__ bool before_step(const ChannelView<Policy>& ch, int64_t t, float (&carried)[Policy::kStates]) {
    if constexpr (Packed) {
      if (t < first_step) {
        sequence = ch.p.sequences.backward_to(sequence, t);
        first_step = ch.p.sequences.boundary(sequence);
        ch.read_states(d_last_state, sequence, carried);
        return true;
      }
    }
    return false;
  }
};

}  // namespace linrec::ssm::lanes
