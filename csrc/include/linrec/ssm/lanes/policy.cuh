// The fused selective scan on the GPU for Mamba's operands (B and C varying along time, n <= 128):
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
//     each of its (first kShareLanes) lanes takes kShare of the tile's steps, and so do they for the
//     output;
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
//
// This header: the policies (a lane's state dims, a channel's lanes, a block's warps), which
// calls the family takes, and its grid.
#pragma once

#include <cstdint>

#include "linrec/ssm/params.h"

namespace linrec::ssm::lanes {

template <int Lanes, int States, int Warps = 4, bool PartialLanes = false>
struct Policy {
  static constexpr int kLanes = Lanes;                  // lanes per channel
  static constexpr int kStates = States;                // state dims per lane
  // Whether a lane may hold state dims both below and past n (n not a multiple of kStates): its sums
  // over its dims then leave the ones past n out one by one (chain), where otherwise a lane's dims are
  // all below n or all past it, and whole lanes are left out.
  static constexpr bool kPartialLanes = PartialLanes;
  static constexpr int kMaxStates = kLanes * kStates;   // the largest n
  static constexpr int kSteps = 16;                     // steps per tile
  // The lanes that share a channel's per-step work (step sizes, output sums, stores): a tile's steps
  // go to at most kSteps of them, kShare each. The lanes past the first kShareLanes (32 lanes a
  // channel) repeat a share lane's work (lane % kShareLanes) and store nothing, so that every lane has
  // the step sizes and their sums without a broadcast.
  static constexpr int kShareLanes = kLanes < kSteps ? kLanes : kSteps;
  static constexpr int kShare = kSteps / kShareLanes;   // a lane's steps of its channel's per-step work
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChannels = kThreads / kLanes;   // per block
  // A slot's [step][state dim] block of gradient terms, padded so that the slots of a warp (each
  // writing a step's kMaxStates terms, 16 bytes at a time) fall in other banks.
  static constexpr int kTermStride = kSteps * kMaxStates + (kMaxStates < 16 ? kMaxStates : 16);
  static constexpr int kTilesPerChunk = kChunk / kSteps;
  // Blocks an SM is to hold at least, which caps the registers of a thread (__launch_bounds__); the
  // backward's registers leave eight warps.
  static constexpr int kForwardMinBlocks = 20 / kWarps;
  static constexpr int kBackwardMinBlocks = 1;
  static constexpr int kBackwardResident = 8 / kWarps;
  static_assert(32 % kLanes == 0 && kSteps % kShareLanes == 0 && kLanes % 4 == 0, "a channel's lanes share a warp");
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

// Calls body.template operator()<Policy>() for Policy<Lanes, 4> (with partial lanes where n is not a
// multiple of 4), or, where the plan chose them and `Wide` allows them, its blocks of eight warps.
template <bool Wide, int Lanes, typename Body>
void with_width(LanePolicy policy, int64_t n, Body& body) {
  const auto with_lanes = [&]<int Warps>() {
    if (n % 4 != 0) body.template operator()<Policy<Lanes, 4, Warps, true>>();
    else body.template operator()<Policy<Lanes, 4, Warps>>();
  };
  if constexpr (Wide) {
    if (policy == LanePolicy::Wide) return with_lanes.template operator()<8>();
  }
  with_lanes.template operator()<4>();
}

// Calls body.template operator()<Policy>() for a plan's policy (ssm::LanePolicy). Narrow: one state dim
// a lane and four lanes a channel up to n = 4, four state dims a lane and four lanes a channel up to 16,
// eight lanes up to 32, sixteen up to 64, thirty-two (a warp) up to 128. A lane's step costs an exp2
// per state dim it holds, state dims past n included: on sixteen lanes, bfloat16 8 x 2048 x n x 2048
// took 1.15 ms forward at n = 24 and 32, as at n = 64 (H200). Eight lanes of one state dim for n <= 8
// took 1.3-1.6 times as long as four of four: each lane's per-step work and the per-step sums over twice
// the lanes. Wide: blocks of eight warps, twice the channels for one tile of B and C (and, in the
// backward, for one atomic add of a varying B's and C's gradient terms): the forward's above n = 16, the
// backward's above 64, where four warps hold four channels. Single: one state dim a lane and sixteen
// lanes a channel, for short rows of few channels.
template <bool Backward, typename Body>
void with_policy(LanePolicy policy, int64_t n, Body&& body) {
  if (policy == LanePolicy::Single) body.template operator()<Policy<16, 1>>();
  else if (n <= 4) body.template operator()<Policy<4, 1>>();
  else if (n <= 16) with_width<false, 4>(policy, n, body);
  else if (n <= 32) with_width<!Backward, 8>(policy, n, body);
  else if (n <= 64) with_width<!Backward, 16>(policy, n, body);
  else with_width<true, 32>(policy, n, body);
}

// The largest n the lane kernels take: a warp of lanes of four state dims.
constexpr int64_t kMaxStates = 128;

// Whether the family takes a call: B and C both varying with the same groups, or both fixed (d, n),
// which a lane then keeps in registers; n <= kMaxStates; a float state. Fixed B and C with n <= 8 take the
// block kernels, whose time grows with n (a scan per state dim) where a lane's of four state dims does
// not: on an H200, bfloat16 and float32 8 x 1024 x n x 2048 forward and backward took 0.67 and 0.64 ms
// in the blocks at n = 4 and 1.04 and 1.00 ms at n = 8, in the lanes 0.98 and 1.04 ms at n = 8 and 16,
// whose policy (four state dims a lane) takes n = 5 to 16 (n = 4, one state dim a lane: 0.74 and 0.84 ms).
constexpr int64_t kFixedMinStates = 9;
inline bool takes(const ForwardParams& p) {
  const bool projections = p.B.varying ? p.C.varying && p.B.groups == p.C.groups : !p.C.varying && p.n >= kFixedMinStates;
  return projections && p.n <= kMaxStates && p.state_dtype == DType::Float32;
}

}  // namespace linrec::ssm::lanes
