// The fused selective scan on the GPU for Mamba's operands (B and C varying along time, n <= 64):
// each lane walks time step by step for kStates state dims of one channel, their states in
// registers, so that a step of a state dim is a multiply-add and an exp2, with no scan across
// threads. kLanes lanes of a warp share a channel (n <= kLanes * kStates); a block holds kChannels
// channels of one batch row and one group of B and C.
//
// A block moves time in tiles of kSteps steps, double-buffered in shared memory and fetched into
// registers one tile ahead:
//   - the tile's B and C of the block's group, as float, [step][state dim], read by each lane as
//     16-byte vectors of its state dims;
//   - each channel's step sizes dt = softplus(delta + bias) and dt * u, computed once per channel:
//     each of its lanes takes kShare of the tile's steps, and so do they for the output;
//   - the lanes' partial sums over their state dims, added up per step across the channel's lanes.
//
// The forward saves the state before every chunk of kChunk steps (params.h) and the last state of
// every sequence. The backward walks the chunks from last to first: it recomputes a chunk's states
// from its checkpoint, keeping the state before every tile in a thread's (local) array, then, tile by
// tile from last to first, recomputes the tile's states in registers and walks them backwards with
// the adjoint. Varying B and C gradients are summed over the block's channels in shared memory and
// added across blocks with 16-byte atomic adds; the per-channel sums (A, D, delta_bias) are per lane,
// added up in a fixed order.
//
// Rows of too few channels to fill the GPU run split along time into segments (grid y, a plan's
// choice): a first pass (the kernels' Ends) gives each segment what the segments before it carry in
// (after it, in the backward), the second starts from that.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "linrec/memio.h"
#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/params.h"
#include "linrec/ssm/step.h"

namespace linrec::ssm::lanes {

template <int Lanes, int States, int Warps = 4>
struct Policy {
  static constexpr int kLanes = Lanes;                  // lanes per channel
  static constexpr int kStates = States;                // state dims per lane
  static constexpr int kMaxStates = kLanes * kStates;   // the largest n
  static constexpr int kSteps = 16;                     // steps per tile
  static constexpr int kShare = kSteps / kLanes;        // a lane's steps of its channel's per-step work
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChannels = kThreads / kLanes;   // per block
  // A slot's [step][state dim] block of gradient terms, padded so that neighbouring slots' rows fall in
  // other banks.
  static constexpr int kTermStride = kSteps * kMaxStates + 16;
  static constexpr int kTilesPerChunk = kChunk / kSteps;
  // Blocks an SM is to hold at least, which caps the registers of a thread (__launch_bounds__); the
  // backward's registers leave two.
  static constexpr int kForwardMinBlocks = 20 / kWarps;
  static constexpr int kBackwardMinBlocks = 1;
  static constexpr int kBackwardResident = 2;
  static_assert(32 % kLanes == 0 && kSteps % kLanes == 0 && kLanes % 4 == 0, "a channel's lanes share a warp");
  static_assert(kChunk % kSteps == 0, "tiles divide a checkpoint chunk");
};

template <typename Policy>
LINREC_HOST_DEVICE int64_t blocks_per_group(const ForwardParams& p) {
  const int64_t per_group = p.d / p.B.groups;
  return (per_group + Policy::kChannels - 1) / Policy::kChannels;
}

template <typename Policy>
int64_t blocks_of(const ForwardParams& p) {
  return p.batch * p.B.groups * blocks_per_group<Policy>(p);
}

// Calls body.template operator()<Policy>() for a plan's policy (ssm::LanePolicy): four state dims a
// lane, four lanes a channel up to n = 16 and sixteen up to 64 (Narrow; Wide: the forward's blocks of
// eight warps, twice the channels for one tile of B and C), or one state dim a lane and sixteen lanes a
// channel (Single, for short rows of few channels). The backward has no Wide policy.
template <bool Backward, typename Body>
void with_policy(LanePolicy policy, int64_t n, Body&& body) {
  if (policy == LanePolicy::Single) body.template operator()<Policy<16, 1>>();
  else if (n <= 16) body.template operator()<Policy<4, 4>>();
  else if constexpr (!Backward) {
    if (policy == LanePolicy::Wide) body.template operator()<Policy<16, 4, 8>>();
    else body.template operator()<Policy<16, 4>>();
  } else {
    body.template operator()<Policy<16, 4>>();
  }
}

// Whether the family takes a call: B and C varying with the same groups, n <= 64, a float state.
inline bool takes(const ForwardParams& p) {
  return p.B.varying && p.C.varying && p.B.groups == p.C.groups && p.n <= 64 &&
         p.state_dtype == DType::Float32;
}

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
  __device__ __forceinline__ int share_offset() const { return lane * Policy::kShare; }
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
  // The lane's state dims of A (0 past n).
  __device__ __forceinline__ void read_A(float (&A)[Policy::kStates]) const {
    #pragma unroll
    for (int i = 0; i < Policy::kStates; ++i)
      A[i] = at.state(i) < p.n ? static_cast<const float*>(p.A)[at.k * p.n + at.state(i)] : 0.0f;
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

// sum_j c_j h_j as a chain of multiply-adds from 0, dim by dim: a lane's four state dims in recur, and
// every run of four in sum_outputs, so that the outputs take one order under every policy.
template <int States>
__device__ __forceinline__ float chain(const float (&c)[States], const float (&h)[States]) {
  float y = 0.0f;
  #pragma unroll
  for (int i = 0; i < States; ++i) y = fmaf(c[i], h[i], y);
  return y;
}

// One step of the lane's state dims: h = exp(dt * A) h + dt u B; returns sum_j C_j h_j (chain).
template <int States>
__device__ __forceinline__ float recur(float (&h)[States], const float (&A2)[States], float dt, float dtu,
                                       const float* B, const float* C) {
  float b[States], c[States];
  load_floats<States>(B, b);
  load_floats<States>(C, c);
  #pragma unroll
  for (int i = 0; i < States; ++i) h[i] = fmaf(decay_from_log2(dt, A2[i]), h[i], dtu * b[i]);
  return chain<States>(c, h);
}

// The step sizes of a lane's share: dt = softplus(delta + bias) (or delta + bias), 0 past the length,
// where the step is then the identity and adds nothing.
template <int Share>
__device__ __forceinline__ void share_step_sizes(const ForwardParams& p, const float (&delta)[Share],
                                                 const float (&u)[Share], int64_t begin, float bias, float (&dt)[Share],
                                                 float (&dtu)[Share]) {
  #pragma unroll
  for (int i = 0; i < Share; ++i) {
    dt[i] = begin + i < p.length ? step_size(delta[i], bias, p.delta_softplus) : 0.0f;
    dtu[i] = dt[i] * u[i];
  }
}

// A tile's per-step values of the block's channels as V, [slot][step]: a lane reads a step's values
// in one access, as the shared-memory pipe is what the forward's steps are short of at n <= 16. Rows
// are padded by 16 bytes, so that the channels of a warp reading one step meet in distinct banks.
template <typename Policy, typename V>
using ChannelSteps = V[Policy::kChannels][Policy::kSteps + 16 / sizeof(V)];

// A tile's per-lane partial sums over the lane's state dims, [step][thread]: a warp writes a step in
// one access; a channel's lanes are neighbouring threads.
template <typename Policy>
using LanePartials = float[Policy::kSteps][Policy::kThreads + 4];

template <typename Policy>
struct __align__(16) ForwardShared {
  typename ProjectionTile<Policy, float>::Storage projections[2];
  ChannelSteps<Policy, float2> steps[2];  // (dt, dt u)
  LanePartials<Policy> partial;
};

// Adds up a tile's per-lane partial sums of the thread's channel per step, for the lane's share of the
// steps, in a fixed order: quads of lanes in turn, the two pairs of each added first.
template <typename Policy>
__device__ __forceinline__ void sum_share(const LanePartials<Policy>& partials, const Place<Policy>& at,
                                          float (&sums)[Policy::kShare]) {
  const int first = at.slot * Policy::kLanes;
  #pragma unroll
  for (int i = 0; i < Policy::kShare; ++i) {
    sums[i] = 0.0f;
    #pragma unroll
    for (int quad = 0; quad < Policy::kLanes / 4; ++quad) {
      float values[4];
      load_floats<4>(&partials[at.share_offset() + i][first + 4 * quad], values);
      sums[i] += (values[0] + values[1]) + (values[2] + values[3]);
    }
  }
}

// What a lane leaves for its channel's output sum at a step: the chain over its four state dims
// (recur's result), or, with one state dim a lane (Single), the state itself, which sum_outputs chains.
template <typename Policy>
__device__ __forceinline__ float output_term(float lane_chain, const float (&h)[Policy::kStates]) {
  if constexpr (Policy::kStates == 1) return h[0];
  else return lane_chain;
}

// The outputs' sums over the state dims, sum_j C_j h_j, of the lane's share of a tile's steps, in one
// order under every policy: runs of four state dims chained (chain), the runs added as sum_share adds
// the lanes of four dims. So a channel's outputs are the same bits whichever policy a call's plan takes
// (the length, the batch and the GPU choose it), and a scan of T steps gives the bits of T scans of one
// step each (selective_state_update). C: the tile's C, [step][state dim].
template <typename Policy>
__device__ __forceinline__ void sum_outputs(const LanePartials<Policy>& partials,
                                            const float (&C)[Policy::kSteps][Policy::kMaxStates],
                                            const Place<Policy>& at, float (&sums)[Policy::kShare]) {
  if constexpr (Policy::kStates == 4) {
    sum_share<Policy>(partials, at, sums);
  } else {
    static_assert(Policy::kStates == 1 && Policy::kLanes == 16, "one state dim a lane: sixteen lanes a channel");
    const int first = at.slot * Policy::kLanes;
    #pragma unroll
    for (int i = 0; i < Policy::kShare; ++i) {
      const int t = at.share_offset() + i;
      float runs[4];
      #pragma unroll
      for (int r = 0; r < 4; ++r) {
        float h[4], c[4];
        load_floats<4>(&partials[t][first + 4 * r], h);
        load_floats<4>(&C[t][4 * r], c);
        runs[r] = chain<4>(c, h);
      }
      sums[i] = 0.0f;
      sums[i] += (runs[0] + runs[1]) + (runs[2] + runs[3]);
    }
  }
}

// The sum of a value over the lanes of the thread's channel (neighbouring threads), the same in each.
template <typename Policy, typename V>
__device__ __forceinline__ V channel_sum(V value) {
  #pragma unroll
  for (int offset = Policy::kLanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// A segment of a row's time (blockIdx.y of segments): rows of few channels are split along time so
// that the GPU has blocks enough. Segments are whole chunks.
struct Segment {
  int64_t index, begin, end;  // steps [begin, end)

  __device__ __forceinline__ explicit Segment(const ForwardParams& p, int64_t index_ = blockIdx.y) : index(index_) {
    const int64_t steps = p.segments > 1 ? p.segment_chunks * kChunk : p.length;
    begin = index * steps;
    end = begin + steps < p.length ? begin + steps : p.length;
  }
};

// A split row's first pass saves, per segment and state dim, the state (or adjoint) it ends in from
// zero and the product of its decays, or kRestarted where a sequence starts (ends, backward) in the
// segment, so that nothing before it carries through. The product of the decays exp(dt A) is
// exp(A sum dt): the channel's step sizes are summed (in double, per lane, then over its lanes), not
// the decays multiplied per state dim and step.
constexpr float kRestarted = -1.0f;

// A lane's share of the step sizes of a tile, added to its running sum.
template <int Share>
__device__ __forceinline__ void add_step_sizes(double& sum, const float (&dt)[Share]) {
  float tile = 0.0f;
  #pragma unroll
  for (int i = 0; i < Share; ++i) tile += dt[i];
  sum += tile;
}

// What the first pass saves of a segment per state dim: the product of its decays, from the channel's
// sum of step sizes, or kRestarted.
template <typename Policy>
__device__ __forceinline__ void segment_decays(double lane_dt_sum, bool restarted, const float (&A2)[Policy::kStates],
                                               float (&decay)[Policy::kStates]) {
  const float dt_sum = static_cast<float>(channel_sum<Policy>(lane_dt_sum));
  #pragma unroll
  for (int i = 0; i < Policy::kStates; ++i) decay[i] = restarted ? kRestarted : decay_from_log2(dt_sum, A2[i]);
}

// The state (or adjoint) h carried through a segment of the first pass's `decay` and `end`, as the
// steps carry it: a product of decays that underflowed to 0 leaves an infinite or NaN h as it is (each
// step's decay is positive), and a 0 h stays 0 through a product that overflowed.
__device__ __forceinline__ float carry_through(float h, float decay, float end) {
  if (decay == kRestarted) return end;
  const float carried = decay == 0.0f || h == 0.0f ? (isfinite(h) ? 0.0f : h) : decay * h;
  return carried + end;
}

// The forward, over one segment of each of the block's rows. Ends: the first pass of a split row,
// which scans each segment but the last from a zero state (or the row's initial one) and saves, per
// state dim, the state it ends in and the product of its decays (or kRestarted) in the
// workspace ([2][segment][row][n]); the second pass (!Ends) starts each segment from the state these
// give, and writes the outputs.
template <typename T, typename W, typename Policy, bool Packed, bool Ends>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kForwardMinBlocks) forward_kernel(const ForwardParams p) {
  constexpr int kStates = Policy::kStates, kSteps = Policy::kSteps, kShare = Policy::kShare;
  enum { kDelta, kU, kZ, kRows };
  __shared__ ForwardShared<Policy> shared;
  const Place<Policy> at(p);
  const ChannelView<Policy> ch{p, at};
  const Segment segment(p);
  const int64_t n = p.n, length = p.length, chunks = chunks_of(length);
  const int64_t first_tile = segment.begin / kSteps, tiles = (segment.end - segment.begin + kSteps - 1) / kSteps;
  const int64_t projection_row = (at.b * p.B.groups + at.group) * n * length;
  const W* B = static_cast<const W*>(p.B.data) + projection_row;
  const W* C = Ends ? nullptr : static_cast<const W*>(p.C.data) + projection_row;
  const auto row_of = [&](const void* data) { return data ? static_cast<const T*>(data) + at.row * length : nullptr; };
  const T* rows[kRows] = {row_of(p.delta), row_of(p.u), Ends ? nullptr : row_of(p.z)};
  T* out_row = static_cast<T*>(p.out) + at.row * length;
  float* checkpoints = static_cast<float*>(p.checkpoints) + at.row * chunks * n;
  // The workspace's [2][segment][row][n]: the segments' end states, then their decay products.
  float* ends = static_cast<float*>(p.workspace);
  float* decays = ends + (p.segments - 1) * p.batch * p.d * n;
  const auto segment_state = [&](int64_t s) { return (s * p.batch * p.d + at.row) * n; };

  float A2[kStates];
  ch.read_A(A2);
  #pragma unroll
  for (int i = 0; i < kStates; ++i) A2[i] = scaled_log2(A2[i]);
  const float bias = ch.per_channel(p.delta_bias), D = ch.per_channel(p.D);
  if (!Ends && segment.index == 0) ch.copy_empty_sequences(p.initial, p.last_state);
  ForwardWalk<Packed> walk(ch, segment.begin);
  float h[kStates];
  double dt_sum = 0.0;                  // the lane's step sizes (Ends)
  bool restarted = segment.index == 0;  // whether a sequence (or the row) starts in the segment (Ends)
  if (segment.index == 0) {
    ch.read_states(p.initial, walk.sequence, h);
  } else {
    // The state before the segment: the earlier segments' ends, each carried through the decays after it.
    #pragma unroll
    for (int i = 0; i < kStates; ++i) h[i] = 0.0f;
    if (!Ends) {
      for (int64_t s = 0; s < segment.index; ++s) {
        #pragma unroll
        for (int i = 0; i < kStates; ++i)
          if (at.state(i) < n)
            h[i] = carry_through(h[i], decays[segment_state(s) + at.state(i)], ends[segment_state(s) + at.state(i)]);
      }
    }
  }

  ProjectionTile<Policy, W> projections;
  ShareRuns<T, kShare, kRows> runs;
  float now[kRows][kShare];  // the current tile's share of the rows
  const auto fetch = [&](int64_t t0) {
    projections.fetch(B, C, n, t0, length, p.vectorized);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) runs.fetch(r, rows[r], at.share_begin(t0), length, p.vectorized);
  };
  const auto commit = [&](int64_t t0, int buffer) {
    projections.commit(shared.projections[buffer]);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) runs.unpack(r, now[r]);
    float dt[kShare], dtu[kShare];
    share_step_sizes<kShare>(p, now[kDelta], now[kU], at.share_begin(t0), bias, dt, dtu);
    if constexpr (Ends) add_step_sizes<kShare>(dt_sum, dt);
    #pragma unroll
    for (int i = 0; i < kShare; ++i) shared.steps[buffer][at.slot][at.share_offset() + i] = make_float2(dt[i], dtu[i]);
  };
  const auto ended = [&](int64_t s, const float (&state)[kStates]) {
    if constexpr (Ends) restarted = true;
    else ch.write_states(p.last_state, s, state);
  };

  if (tiles > 0) {
    fetch(first_tile * kSteps);
    commit(first_tile * kSteps, 0);
  }
  __syncthreads();
  for (int64_t tile = first_tile; tile < first_tile + tiles; ++tile) {
    const int buffer = (tile - first_tile) & 1;
    const int64_t t0 = tile * kSteps;
    if (tile + 1 < first_tile + tiles) fetch(t0 + kSteps);
    if (!Ends && tile % Policy::kTilesPerChunk == 0 && at.active) {
      #pragma unroll
      for (int i = 0; i < kStates; ++i)
        if (at.state(i) < n) checkpoints[tile / Policy::kTilesPerChunk * n + at.state(i)] = h[i];
    }

    // Unrolled by a quarter tile: a whole tile's loads hoisted ahead take registers that cost
    // resident warps.
    #pragma unroll 4
    for (int t = 0; t < kSteps; ++t) {
      walk.before_step(ch, t0 + t, h, ended);
      const float2 step = shared.steps[buffer][at.slot][t];
      const float y = recur<kStates>(h, A2, step.x, step.y,
                                     &shared.projections[buffer][0][t][at.state(0)],
                                     &shared.projections[buffer][1][t][at.state(0)]);
      if constexpr (!Ends) shared.partial[t][threadIdx.x] = output_term<Policy>(y, h);
    }

    if constexpr (!Ends) {
      // The output: the lanes' partial sums added up per step, by the lane whose share the step is.
      __syncwarp();
      float y[kShare];
      sum_outputs<Policy>(shared.partial, shared.projections[buffer][1], at, y);
      #pragma unroll
      for (int i = 0; i < kShare; ++i) {
        y[i] = fmaf(D, now[kU][i], y[i]);
        if (p.z) y[i] *= silu(now[kZ][i]);
      }
      if (at.active) store_run<kShare>(out_row, at.share_begin(t0), length, p.vectorized, y);
    }
    if (tile + 1 < first_tile + tiles) commit(t0 + kSteps, buffer ^ 1);
    __syncthreads();
  }
  if constexpr (Ends) {
    float decay[kStates];
    segment_decays<Policy>(dt_sum, restarted, A2, decay);
    if (at.active) {
      #pragma unroll
      for (int i = 0; i < kStates; ++i) {
        if (at.state(i) >= n) continue;
        ends[segment_state(segment.index) + at.state(i)] = h[i];
        decays[segment_state(segment.index) + at.state(i)] = decay[i];
      }
    }
  } else if (segment.end == length && length > 0) {
    ch.write_states(p.last_state, walk.sequence, h);
  }
}

template <typename Policy>
struct __align__(16) BackwardShared {
  typename ProjectionTile<Policy, float>::Storage projections[2];
  // (dt, dt u, dy, unused), dy = d out * silu(z) the gradient of the ungated output.
  ChannelSteps<Policy, float4> steps[2];
  LanePartials<Policy> partial[2];
  float terms[Policy::kChannels][Policy::kTermStride];  // a varying B or C gradient's terms, [step][state dim]
};

// Adds the block's terms of a varying projection's gradient over its channels, in a fixed order, and
// the sums across blocks with a 16-byte atomic add (sm_90), or stores them (`store`: the block's own
// part of a deterministic backward's workspace): per state dim and four steps, kSplit neighbouring
// threads each add every kSplit-th slot, then their sums. Idle slots' terms are zeros.
template <typename Policy>
__device__ __forceinline__ void add_terms(const BackwardShared<Policy>& shared, float* gradient, int64_t n, int64_t t0,
                                          int64_t length, bool aligned, bool store) {
  constexpr int kOutputs = Policy::kMaxStates * Policy::kSteps / 4;
  constexpr int kSplit = Policy::kThreads > kOutputs ? Policy::kThreads / kOutputs : 1;
  static_assert(kSplit == 1 || kSplit == 2, "two threads at most share an output");
  #pragma unroll
  for (int first = 0; first < kOutputs * kSplit; first += Policy::kThreads) {
    const int o = (first + threadIdx.x) / kSplit, part = threadIdx.x % kSplit;
    const int j = o % Policy::kMaxStates, quad = o / Policy::kMaxStates;
    float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (int slot = part; slot < Policy::kChannels; slot += kSplit) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) sums[e] += shared.terms[slot][(4 * quad + e) * Policy::kMaxStates + j];
    }
    if constexpr (kSplit == 2) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) sums[e] += __shfl_xor_sync(0xffffffffu, sums[e], 1);
    }
    if (part != 0 || j >= n) continue;
    float* target = gradient + j * length;
    const int64_t t = t0 + 4 * quad;
    if (store) {
      store_run<4>(target, t, length, aligned, sums);
      continue;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (aligned && t + 4 <= length) {
      atomicAdd(reinterpret_cast<float4*>(target + t), make_float4(sums[0], sums[1], sums[2], sums[3]));
      continue;
    }
#endif
    #pragma unroll
    for (int e = 0; e < 4; ++e)
      if (t + e < length) atomicAdd(target + t + e, sums[e]);
  }
}

// The backward workspace, in floats. Of a split row: [segment][batch * d][n] each of the adjoints a
// segment carries out of its first step (from a zero adjoint after it, the first pass) and of its
// decay products; then the segments' partial sums of d_A ([segment][batch * d][n]), d_D and
// d_delta_bias ([segment][batch * d]), which sum_segments adds up. Of a deterministic backward: each
// block of channels' sums of varying B's and then C's gradient terms, [channel block][B's shape],
// which sum_channel_blocks adds up.
struct BackwardWorkspace {
  float *carried, *decays, *d_A, *d_D, *d_delta_bias;
  float *d_B_parts, *d_C_parts;

  LINREC_HOST_DEVICE static int64_t projection_floats(const ForwardParams& p) {
    return p.batch * p.B.groups * p.n * p.length;
  }
  LINREC_HOST_DEVICE static int64_t floats(const BackwardParams& p) {
    return (p.segments > 1 ? p.segments * p.batch * p.d * (3 * p.n + 2) : 0) +
           2 * p.channel_blocks * projection_floats(p);
  }
  LINREC_HOST_DEVICE explicit BackwardWorkspace(const BackwardParams& p) {
    const int64_t states = p.segments > 1 ? p.segments * p.batch * p.d * p.n : 0;
    carried = static_cast<float*>(p.workspace);
    decays = carried + states;
    d_A = decays + states;
    d_D = d_A + states;
    d_delta_bias = d_D + (p.segments > 1 ? p.segments * p.batch * p.d : 0);
    d_B_parts = d_delta_bias + (p.segments > 1 ? p.segments * p.batch * p.d : 0);
    d_C_parts = d_B_parts + p.channel_blocks * projection_floats(p);
  }
};

// A deterministic backward's varying B and C gradients: the blocks of channels' sums added up in
// block order.
__global__ void sum_channel_blocks(const BackwardParams p) {
  const BackwardWorkspace ws(p);
  const int64_t size = BackwardWorkspace::projection_floats(p);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < 2 * size; e += gridDim.x * int64_t(blockDim.x)) {
    const bool of_B = e < size;
    const float* parts = (of_B ? ws.d_B_parts : ws.d_C_parts) + (of_B ? e : e - size);
    float total = 0.0f;
    for (int64_t block = 0; block < p.channel_blocks; ++block) total += parts[block * size];
    static_cast<float*>(of_B ? p.d_B : p.d_C)[of_B ? e : e - size] = total;
  }
}

// The partial sums of a split row's segments, added up in segment order (deterministic).
__global__ void sum_segments(const BackwardParams p) {
  const BackwardWorkspace ws(p);
  const int64_t rows = p.batch * p.d, states = rows * p.n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < states + 2 * rows; e += gridDim.x * int64_t(blockDim.x)) {
    const float* parts = e < states ? ws.d_A + e : e < states + rows ? ws.d_D + (e - states) : ws.d_delta_bias + (e - states - rows);
    const int64_t stride = e < states ? states : rows;
    float total = 0.0f;
    for (int64_t s = 0; s < p.segments; ++s) total += parts[s * stride];
    if (e < states) static_cast<float*>(p.d_A)[e] = total;
    else if (e < states + rows) { if (p.d_D) static_cast<float*>(p.d_D)[e - states] = total; }
    else if (p.d_delta_bias) static_cast<float*>(p.d_delta_bias)[e - states - rows] = total;
  }
}

// The backward, over one segment of each of the block's rows. Ends: the first pass of a split row,
// which walks each segment but the first back with the adjoint alone, from a zero adjoint after it
// (or a sequence's last-state gradient), and saves what it carries out of its first step and the
// product of its decays (or kRestarted); the second pass (!Ends) starts each segment from
// the adjoint these give.
template <typename T, typename W, typename Policy, bool Packed, bool Ends>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kBackwardMinBlocks) backward_kernel(const BackwardParams p) {
  constexpr int kStates = Policy::kStates, kSteps = Policy::kSteps, kShare = Policy::kShare,
                kTilesPerChunk = Policy::kTilesPerChunk;
  enum { kDelta, kU, kZ, kOut, kRows };
  extern __shared__ __align__(16) unsigned char dynamic_storage[];
  auto& shared = *reinterpret_cast<BackwardShared<Policy>*>(dynamic_storage);
  const Place<Policy> at(p);
  const ChannelView<Policy> ch{p, at};
  // The first pass takes segments 1, 2, ... (grid y + 1): the first one's carry is not needed.
  Segment segment(p);
  if (Ends) segment = Segment(p, segment.index + 1);
  const int64_t n = p.n, length = p.length, tiles = (length + kSteps - 1) / kSteps, chunks = chunks_of(length);
  const int64_t projection_row = (at.b * p.B.groups + at.group) * n * length;
  const W* B = static_cast<const W*>(p.B.data) + projection_row;
  const W* C = static_cast<const W*>(p.C.data) + projection_row;
  const BackwardWorkspace ws(p);
  const auto segment_state = [&](int64_t s) { return (s * p.batch * p.d + at.row) * n; };
  // A deterministic backward's blocks store their sums apart (their own part of the workspace).
  const bool store_terms = p.channel_blocks > 0;
  const int64_t part = store_terms ? at.channel_block * BackwardWorkspace::projection_floats(p) : 0;
  float* d_B = (store_terms ? ws.d_B_parts + part : static_cast<float*>(p.d_B)) + projection_row;
  float* d_C = (store_terms ? ws.d_C_parts + part : static_cast<float*>(p.d_C)) + projection_row;
  const auto row_of = [&](const void* data) { return data ? static_cast<const T*>(data) + at.row * length : nullptr; };
  const T* rows[kRows] = {row_of(p.delta), row_of(p.u), row_of(p.z), row_of(p.d_out)};
  T* d_u_row = static_cast<T*>(p.d_u) + at.row * length;
  T* d_delta_row = static_cast<T*>(p.d_delta) + at.row * length;
  T* d_z_row = p.z ? static_cast<T*>(p.d_z) + at.row * length : nullptr;
  const float* checkpoints = static_cast<const float*>(p.saved_checkpoints) + at.row * chunks * n;

  float A[kStates], A2[kStates];
  ch.read_A(A);
  #pragma unroll
  for (int i = 0; i < kStates; ++i) A2[i] = scaled_log2(A[i]);
  const float bias = ch.per_channel(p.delta_bias), D = ch.per_channel(p.D);
  if (!Ends && segment.index == 0) ch.copy_empty_sequences(p.d_last_state, p.d_initial);

  // The reverse walk: the sequence of the current step and its first step; the adjoint carried back
  // from the step after (exp(dt A) g there), which starts from a sequence's last-state gradient where
  // the segment ends one, else from the later segments' (the first pass's) or zero (in it).
  ReverseWalk<Packed> back(ch, p.d_last_state, segment.begin, segment.end);
  const bool ends_sequence = segment.end == length || (Packed && ch.next_start(back.sequence) == segment.end);
  float carried[kStates], d_A[kStates];
  double dt_sum = 0.0;             // the lane's step sizes (Ends)
  bool restarted = ends_sequence;  // whether a sequence ends in the segment, so that no adjoint passes (Ends)
  #pragma unroll
  for (int i = 0; i < kStates; ++i) carried[i] = 0.0f, d_A[i] = 0.0f;
  if (ends_sequence) {
    ch.read_states(p.d_last_state, back.sequence, carried);
  } else if (!Ends) {
    for (int64_t s = p.segments - 1; s > segment.index; --s) {
      #pragma unroll
      for (int i = 0; i < kStates; ++i)
        if (at.state(i) < n)
          carried[i] = carry_through(carried[i], ws.decays[segment_state(s) + at.state(i)],
                                     ws.carried[segment_state(s) + at.state(i)]);
    }
  }
  float sum_D = 0.0f, sum_delta_bias = 0.0f;  // over the lane's share of the steps
  float before[kTilesPerChunk][kStates];      // the state before each tile of the chunk (as saved: before restarts)
  float h[kStates];                           // the chunk's recomputed state
  ForwardWalk<Packed> walk(ch, 0);

  // The schedule: the segment's chunks from last to first; in each, its tiles first to last
  // (recomputing the states before them), then last to first (the adjoint). Stage i of a chunk of m
  // tiles: tile i for i < m, tile 2m - 1 - i after. The first pass takes the second half only.
  const auto tiles_of = [&](int64_t c) { return min(static_cast<int64_t>(kTilesPerChunk), tiles - c * kTilesPerChunk); };
  const auto stages_of = [&](int64_t c) { return static_cast<int>(tiles_of(c)) * (Ends ? 1 : 2); };
  const auto tile_of = [&](int64_t c, int stage) {
    const int m = static_cast<int>(tiles_of(c));
    if (Ends) stage += m;
    return c * kTilesPerChunk + (stage < m ? stage : 2 * m - 1 - stage);
  };
  const int64_t first_chunk = segment.begin / kChunk, last_chunk = (segment.end + kChunk - 1) / kChunk - 1;

  ProjectionTile<Policy, W> projections;
  ShareRuns<T, kShare, kRows> runs;
  float now[kRows][kShare];
  // A recomputing stage (the first half of a chunk's) takes B, delta and u only.
  const auto fetch = [&](int64_t t0, bool adjoint) {
    projections.fetch(B, adjoint ? C : nullptr, n, t0, length, p.vectorized);
    #pragma unroll
    for (int r = 0; r < kRows; ++r)
      runs.fetch(r, adjoint || r == kDelta || r == kU ? rows[r] : nullptr, at.share_begin(t0), length, p.vectorized);
  };
  const auto commit = [&](int64_t t0, bool adjoint, int buffer) {
    projections.commit(shared.projections[buffer]);
    #pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (adjoint || r == kDelta || r == kU) runs.unpack(r, now[r]);
    float dt[kShare], dtu[kShare];
    share_step_sizes<kShare>(p, now[kDelta], now[kU], at.share_begin(t0), bias, dt, dtu);
    if constexpr (Ends) add_step_sizes<kShare>(dt_sum, dt);
    #pragma unroll
    for (int i = 0; i < kShare; ++i) {
      const float dy = !adjoint ? 0.0f : p.z ? now[kOut][i] * silu(now[kZ][i]) : now[kOut][i];
      shared.steps[buffer][at.slot][at.share_offset() + i] = make_float4(dt[i], dtu[i], dy, 0.0f);
    }
  };

  int64_t chunk = last_chunk;
  int stage = 0, buffer = 0;
  const bool any = segment.end > segment.begin;
  if (any) {
    fetch(tile_of(chunk, 0) * kSteps, Ends);
    commit(tile_of(chunk, 0) * kSteps, Ends, 0);
  }
  __syncthreads();
  while (any && chunk >= first_chunk) {
    const int m = static_cast<int>(tiles_of(chunk));
    const int64_t t0 = tile_of(chunk, stage) * kSteps;
    const int local = static_cast<int>(tile_of(chunk, stage) - chunk * kTilesPerChunk);
    const int64_t next_chunk = stage + 1 < stages_of(chunk) ? chunk : chunk - 1;
    const int next_stage = stage + 1 < stages_of(chunk) ? stage + 1 : 0;
    const bool more = next_chunk >= first_chunk;
    const bool next_adjoint = more && (Ends || next_stage >= tiles_of(next_chunk));
    if (more) fetch(tile_of(next_chunk, next_stage) * kSteps, next_adjoint);
    const float4* steps = shared.steps[buffer][at.slot];  // (dt, dt u, dy, unused)
    const auto& Bs = shared.projections[buffer][0];
    const auto& Cs = shared.projections[buffer][1];
    const auto ignore = [](int64_t, const float (&)[kStates]) {};

    if (Ends) {
      // The adjoint alone, from the tile's last step to its first.
      #pragma unroll 4
      for (int t = kSteps - 1; t >= 0; --t) {
        if (back.before_step(ch, t0 + t, carried)) restarted = true;
        float c[kStates];
        load_floats<kStates>(&Cs[t][at.state(0)], c);
        const float4 step = steps[t];
        #pragma unroll
        for (int i = 0; i < kStates; ++i) carried[i] = decay_from_log2(step.x, A2[i]) * (step.z * c[i] + carried[i]);
      }
    } else if (stage < m) {
      // The states before each tile, from the chunk's checkpoint.
      if (stage == 0) {
        #pragma unroll
        for (int i = 0; i < kStates; ++i) h[i] = at.state(i) < n ? checkpoints[chunk * n + at.state(i)] : 0.0f;
        walk = ForwardWalk<Packed>(ch, t0);
      }
      #pragma unroll
      for (int i = 0; i < kStates; ++i) before[local][i] = h[i];
      #pragma unroll
      for (int t = 0; t < kSteps; ++t) {
        walk.before_step(ch, t0 + t, h, ignore);
        const float4 step = steps[t];
        recur<kStates>(h, A2, step.x, step.y, &Bs[t][at.state(0)], &Cs[t][at.state(0)]);
      }
    } else {
      // The tile's states again, in registers, with the ungated output's per-lane terms and C's gradient.
      float states[kSteps][kStates], start[kStates], x[kStates];
      #pragma unroll
      for (int i = 0; i < kStates; ++i) start[i] = x[i] = before[local][i];
      ForwardWalk<Packed> tile_walk(ch, t0);
      #pragma unroll
      for (int t = 0; t < kSteps; ++t) {
        tile_walk.before_step(ch, t0 + t, x, ignore);
        const float4 step = steps[t];
        const float lane_chain = recur<kStates>(x, A2, step.x, step.y, &Bs[t][at.state(0)], &Cs[t][at.state(0)]);
        shared.partial[0][t][threadIdx.x] = output_term<Policy>(lane_chain, x);
        float terms[kStates];
        #pragma unroll
        for (int i = 0; i < kStates; ++i) {
          states[t][i] = x[i];
          terms[i] = at.active ? step.z * x[i] : 0.0f;
        }
        store_floats<kStates>(&shared.terms[at.slot][t * Policy::kMaxStates + at.state(0)], terms);
      }
      __syncthreads();
      add_terms<Policy>(shared, d_C, n, t0, length, p.vectorized, store_terms);
      float y[kShare];
      sum_outputs<Policy>(shared.partial[0], Cs, at, y);
      __syncthreads();

      // The adjoint, from the tile's last step to its first.
      // Per step, over the lane's state dims: sum_j g_j B_j, and sum_j g_j exp(dt A_j) x_j A_j.
      #pragma unroll
      for (int t = kSteps - 1; t >= 0; --t) {
        const int64_t step = t0 + t;
        back.before_step(ch, step, carried);
        float prior[kStates], b[kStates], c[kStates], terms[kStates];
        if (step == back.first_step) ch.read_states(p.initial, back.sequence, prior);
        else {
          #pragma unroll
          for (int i = 0; i < kStates; ++i) prior[i] = t == 0 ? start[i] : states[t > 0 ? t - 1 : 0][i];
        }
        load_floats<kStates>(&Bs[t][at.state(0)], b);
        load_floats<kStates>(&Cs[t][at.state(0)], c);
        const float4 step_values = steps[t];
        const float dt = step_values.x, dtu = step_values.y, dy = step_values.z;
        float q_step = 0.0f, r_step = 0.0f;
        #pragma unroll
        for (int i = 0; i < kStates; ++i) {
          const float a = decay_from_log2(dt, A2[i]);
          const float g = dy * c[i] + carried[i];   // the adjoint of the state after the step
          const float g_decayed = g * a * prior[i];  // d / d(dt A) of the step
          d_A[i] += g_decayed * dt;
          r_step += g_decayed * A[i];
          q_step += g * b[i];
          terms[i] = at.active ? g * dtu : 0.0f;
          carried[i] = a * g;
        }
        shared.partial[0][t][threadIdx.x] = q_step;
        shared.partial[1][t][threadIdx.x] = r_step;
        store_floats<kStates>(&shared.terms[at.slot][t * Policy::kMaxStates + at.state(0)], terms);
        if (step == back.first_step) ch.write_states(p.d_initial, back.sequence, carried);
      }
      __syncthreads();
      add_terms<Policy>(shared, d_B, n, t0, length, p.vectorized, store_terms);
      float q_sum[kShare], r_sum[kShare], d_u[kShare], d_delta[kShare], d_z[kShare];
      sum_share<Policy>(shared.partial[0], at, q_sum);
      sum_share<Policy>(shared.partial[1], at, r_sum);
      #pragma unroll
      for (int i = 0; i < kShare; ++i) {
        const int offset = at.share_offset() + i;
        const float u = now[kU][i], dt = steps[offset].x, dy = steps[offset].z;
        d_u[i] = q_sum[i] * dt + D * dy;
        const float d_dt = q_sum[i] * u + r_sum[i];
        d_delta[i] = p.delta_softplus ? d_dt * softplus_slope(now[kDelta][i] + bias) : d_dt;
        d_z[i] = now[kOut][i] * fmaf(D, u, y[i]) * silu_slope(now[kZ][i]);
        if (t0 + offset < length) {
          sum_D += dy * u;
          sum_delta_bias += d_delta[i];
        }
      }
      if (at.active) {
        store_run<kShare>(d_u_row, at.share_begin(t0), length, p.vectorized, d_u);
        store_run<kShare>(d_delta_row, at.share_begin(t0), length, p.vectorized, d_delta);
        if (d_z_row) store_run<kShare>(d_z_row, at.share_begin(t0), length, p.vectorized, d_z);
      }
    }
    if (more) commit(tile_of(next_chunk, next_stage) * kSteps, next_adjoint, buffer ^ 1);
    __syncthreads();
    buffer ^= 1;
    chunk = next_chunk;
    stage = next_stage;
  }

  if constexpr (Ends) {
    float decay[kStates];
    segment_decays<Policy>(dt_sum, restarted, A2, decay);
    if (at.active) {
      #pragma unroll
      for (int i = 0; i < kStates; ++i) {
        if (at.state(i) >= n) continue;
        ws.carried[segment_state(segment.index) + at.state(i)] = carried[i];
        ws.decays[segment_state(segment.index) + at.state(i)] = decay[i];
      }
    }
    return;
  }
  // The per-row partial sums (per segment of a split row): d_A per lane, d_D and d_delta_bias over the
  // channel's lanes.
  sum_D = channel_sum<Policy>(sum_D);
  sum_delta_bias = channel_sum<Policy>(sum_delta_bias);
  if (!at.active) return;
  const bool split = p.segments > 1;
  float* partial_A = split ? ws.d_A + segment_state(segment.index) : static_cast<float*>(p.d_A) + at.row * n;
  #pragma unroll
  for (int i = 0; i < kStates; ++i)
    if (at.state(i) < n) partial_A[at.state(i)] = d_A[i];
  if (at.lane == 0) {
    const int64_t row = split ? segment.index * p.batch * p.d + at.row : at.row;
    if (p.d_D) (split ? ws.d_D : static_cast<float*>(p.d_D))[row] = sum_D;
    if (p.d_delta_bias) (split ? ws.d_delta_bias : static_cast<float*>(p.d_delta_bias))[row] = sum_delta_bias;
  }
}

}  // namespace linrec::ssm::lanes
