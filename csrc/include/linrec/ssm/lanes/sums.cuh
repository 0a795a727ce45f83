// The lane kernels' arithmetic of a step and their sums across a channel's lanes
// (ssm/lanes/policy.cuh): the recurrence of a lane's state dims, the step sizes, and the outputs' sums
// over the state dims in one order under every policy.
#pragma once

#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/lanes/agent.cuh"
#include "linrec/ssm/step.h"

namespace linrec::ssm::lanes {

// sum_j c_j h_j over the first `dims` of the lane's state dims (those below n), as a chain of
// multiply-adds from 0, dim by dim: a lane's four state dims in recur, and every run of four in
// sum_outputs, so that the outputs take one order under every policy. The dims past n are left out,
// not added as 0 * h: an infinite dt or dt u turns their state NaN (inf * 0), which the loop has no
// dim to hold. Partial: dims may lie between 0 and States, each dim tested (a predicate per dim and
// step, about a tenth more instructions in the forward's step); else it is 0 or States, the chain
// dropped whole.
template <int States, bool Partial>
__device__ __forceinline__ float chain(const float (&c)[States], const float (&h)[States], int dims) {
  float y = 0.0f;
  #pragma unroll
  for (int i = 0; i < States; ++i)
    if (!Partial || i < dims) y = fmaf(c[i], h[i], y);
  return Partial || dims > 0 ? y : 0.0f;
}

// One step of the lane's state dims: h = exp(dt * A) h + dt u b; returns sum_j c_j h_j over its first
// `dims` (chain).
template <int States, bool Partial>
__device__ __forceinline__ float step_dims(float (&h)[States], const float (&A2)[States], float dt, float dtu,
                                           const float (&b)[States], const float (&c)[States], int dims) {
  #pragma unroll
  for (int i = 0; i < States; ++i) h[i] = fmaf(decay_from_log2(dt, A2[i]), h[i], dtu * b[i]);
  return chain<States, Partial>(c, h, dims);
}

// step_dims with the step's B and C read from shared memory.
template <int States, bool Partial>
__device__ __forceinline__ float recur(float (&h)[States], const float (&A2)[States], float dt, float dtu,
                                       const float* B, const float* C, int dims) {
  float b[States], c[States];
  load_floats<States>(B, b);
  load_floats<States>(C, c);
  return step_dims<States, Partial>(h, A2, dt, dtu, b, c, dims);
}

// Where a lane reads a step's B and C over its state dims: the block's tile of its group in shared
// memory ([B or C][step][state dim], varying), or registers (Fixed: the channel's, the same every step).
template <typename Policy, bool Fixed>
struct LaneProjections {
  static constexpr int kStates = Policy::kStates;
  using Tile = float[2][Policy::kSteps][Policy::kMaxStates];
  float fixed_B[Fixed ? kStates : 1], fixed_C[Fixed ? kStates : 1];

  // A fixed B's and C's state dims of the lane's channel.
  __device__ __forceinline__ explicit LaneProjections(const ChannelView<Policy>& ch) {
    if constexpr (Fixed) {
      ch.read_dims(ch.p.B.data, fixed_B);
      ch.read_dims(ch.p.C.data, fixed_C);
    }
  }
  // B and C of step t of a tile, over the state dims from `first` (the lane's first).
  __device__ __forceinline__ void at(const Tile& tile, int t, int first, float (&b)[kStates], float (&c)[kStates]) const {
    if constexpr (Fixed) {
      #pragma unroll
      for (int i = 0; i < kStates; ++i) b[i] = fixed_B[i], c[i] = fixed_C[i];
    } else {
      load_floats<kStates>(&tile[0][t][first], b);
      load_floats<kStates>(&tile[1][t][first], c);
    }
  }
};

// A channel's fixed C over all its state dims, for policies of one state dim a lane, whose sum over
// the state dims (sum_outputs) takes C of its lanes' dims: [slot][state dim].
template <typename Policy, bool Fixed>
using FixedRows = float[Fixed && Policy::kStates == 1 ? Policy::kChannels : 1][Policy::kMaxStates];

// A lane's constants of its channel: A over its state dims (and A log2(e), which exp2 takes), delta_bias,
// D, and where to read B and C. A fixed C of one state dim a lane is shared in the block's `rows` (read
// after the block's next barrier).
template <typename Policy, bool Fixed>
struct LaneConstants {
  float A[Policy::kStates], A2[Policy::kStates];
  float bias, D;
  LaneProjections<Policy, Fixed> projections;

  __device__ __forceinline__ LaneConstants(const ChannelView<Policy>& ch, FixedRows<Policy, Fixed>& rows)
      : bias(ch.per_channel(ch.p.delta_bias)), D(ch.per_channel(ch.p.D)), projections(ch) {
    ch.read_dims(ch.p.A, A);
    #pragma unroll
    for (int i = 0; i < Policy::kStates; ++i) A2[i] = scaled_log2(A[i]);
    if constexpr (Fixed && Policy::kStates == 1) rows[ch.at.slot][ch.at.state(0)] = projections.fixed_C[0];
  }
};

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

// Adds up a tile's per-lane partial sums of the thread's channel per step, for the lane's share of the
// steps, in a fixed order: quads of lanes in turn, the two pairs of each added first. The lanes from
// `lanes` on (those past n) count as 0.
template <typename Policy>
__device__ __forceinline__ void sum_share(const LanePartials<Policy>& partials, const Place<Policy>& at,
                                          float (&sums)[Policy::kShare], int lanes = Policy::kLanes) {
  const int first = at.slot * Policy::kLanes;
  #pragma unroll
  for (int i = 0; i < Policy::kShare; ++i) {
    sums[i] = 0.0f;
    #pragma unroll
    for (int quad = 0; quad < Policy::kLanes / 4; ++quad) {
      float values[4];
      load_floats<4>(&partials[at.share_offset() + i][first + 4 * quad], values);
      #pragma unroll
      for (int e = 0; e < 4; ++e) values[e] = 4 * quad + e < lanes ? values[e] : 0.0f;
      sums[i] += (values[0] + values[1]) + (values[2] + values[3]);
    }
  }
}

// What a lane leaves for its channel's output sum at a step: the chain over its four state dims
// (recur's result), or, with one state dim a lane, the state itself, which sum_outputs chains (0 for a
// lane past n: chain).
template <typename Policy>
__device__ __forceinline__ float output_term(float lane_chain, const float (&h)[Policy::kStates], int dims) {
  if constexpr (Policy::kStates == 1) return dims > 0 ? h[0] : 0.0f;
  else return lane_chain;
}

// The outputs' sums over the state dims, sum_j C_j h_j, of the lane's share of a tile's steps, in one
// order under every policy: runs of four state dims chained (chain), the runs added as sum_share adds
// the lanes of four dims, the runs past a policy's state dims as zeros (sum_share over four lanes of
// four state dims adds (r0 + r1) + (r2 + r3)). So a channel's outputs are the same bits whichever
// policy a call's plan takes (n, the length, the batch and the GPU choose it), and a scan of T steps
// gives the bits of T scans of one step each (selective_state_update). C: the row of C over the state
// dims at the tile's first step, the next step's `step_stride` floats on (a varying C's tile,
// [step][state dim]; 0 for a fixed C).
template <typename Policy>
__device__ __forceinline__ void sum_outputs(const LanePartials<Policy>& partials, const float* C, int step_stride,
                                            const Place<Policy>& at, float (&sums)[Policy::kShare]) {
  if constexpr (Policy::kStates == 4) {
    sum_share<Policy>(partials, at, sums);
  } else {
    static_assert(Policy::kStates == 1 && Policy::kLanes <= 16, "one state dim a lane: up to sixteen lanes a channel");
    constexpr int kRuns = Policy::kLanes / 4;
    const int first = at.slot * Policy::kLanes;
    #pragma unroll
    for (int i = 0; i < Policy::kShare; ++i) {
      const int t = at.share_offset() + i;
      float runs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      #pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        float h[4], c[4];
        load_floats<4>(&partials[t][first + 4 * r], h);
        load_floats<4>(C + t * step_stride + 4 * r, c);
        runs[r] = chain<4, false>(c, h, 4);  // lanes past n left 0 (output_term)
      }
      sums[i] = 0.0f;
      sums[i] += (runs[0] + runs[1]) + (runs[2] + runs[3]);
    }
  }
}

// The sum of a per-share value over the share lanes of the thread's channel (neighbouring threads), the
// same in each lane: the lanes past them repeat their shares (Policy::kShareLanes), and their butterfly
// gives them the same sum.
template <typename Policy, typename V>
__device__ __forceinline__ V channel_sum(V value) {
  #pragma unroll
  for (int offset = Policy::kShareLanes / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

}  // namespace linrec::ssm::lanes
