// The lane kernels' plan (ssm/lanes/policy.cuh): which policy a call takes and how its rows split along
// time, from a model of the time the SMs take; its rates and costs are fits to measured runs. Host code,
// one plan per call (cuda::make_plan in kernels/cuda/selective_scan.cu).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "linrec/device_shape.h"
#include "linrec/ssm/lanes/policy.cuh"
#include "linrec/ssm/params.h"

namespace linrec::ssm::lanes {

// The relative rate at which an SM runs the lane kernels' steps with `warps` warps resident: they are
// bound by the latency of the exp2 unit and of shared memory, which more warps hide. Measured on an
// H100 as the times of bfloat16 rows of 2048 and 5120 channels (n = 16 and 64) split into 1 to 64
// segments, at 4, 8, 12, 16 and 20 warps; the backward's blocks (two an SM at most) took as long
// alone as in pairs.
template <bool Backward>
inline double warp_rate(int64_t warps) {
  constexpr double kRates[] = {0.0, Backward ? 0.39 : 0.5, 0.78, 0.9, 0.95, 1.0};
  if (warps >= 20) return 1.0;
  const int64_t below = warps / 4;
  return kRates[below] + static_cast<double>(warps % 4) / 4 * (kRates[below + 1] - kRates[below]);
}

// The modelled time of a pass of `blocks` blocks of `warps` warps, `resident` of them at most on an SM
// at once, per step of a block: the SMs take the blocks in turns, and a turn of k blocks takes
// k * warps / warp_rate(k * warps).
template <bool Backward>
inline double pass_time(int64_t blocks, int64_t warps, int64_t resident, int64_t sms) {
  const int64_t per_sm = (blocks + sms - 1) / sms;
  const auto turn = [&](int64_t k) {
    return k == 0 ? 0.0 : static_cast<double>(k * warps) / warp_rate<Backward>(k * warps);
  };
  return static_cast<double>(per_sm / resident) * turn(resident) + turn(per_sm % resident);
}

// Whether the lane kernels take a backward (takes): above n = 64 only where n fills enough of its
// policy's state dims. A lane's step costs every state dim its policy holds (thirty-two lanes of four,
// 128, from n = 65), the block kernels' backward the n it has: on an H200, bfloat16 8 x 2048 x n x 2048
// took 13.2, 16.2, 20.1 and 25.7 ms in the blocks' backward at n = 65, 80, 100 and 128 (0.20 ms a state
// dim) and 15.3 to 17.1 ms in the lanes' at each (0.12 ms a held dim, a partial lane's 8% more), so the
// blocks take n below 1 / 1.65 of the held dims, n = 65 to 77. Their forward, which the lanes' outruns
// at every n, saves the same checkpoints. A deterministic backward of a varying B or C stays in the
// lanes, whose sums are in a fixed order.
constexpr double kBlockStateCost = 1.65;  // a block kernel's backward state dim, in lane state dims
inline bool takes_backward(const BackwardParams& params) {
  if (!takes(params)) return false;
  if (params.n <= 64 || (params.deterministic && params.B.varying)) return true;
  int64_t held = 0;
  with_policy<true>(LanePolicy::Narrow, params.n, [&]<typename Policy>() { held = Policy::kMaxStates; });
  return kBlockStateCost * static_cast<double>(params.n) >= static_cast<double>(held);
}

// The lane kernels' plan: the policy and the split of the rows along time (segments of whole chunks)
// that the model gives the least time, where a split row takes a first pass over all its segments but
// the last (ssm/lanes/). A step of a forward's Wide block costs 0.82 of a Narrow one's per warp
// (its blocks stage a tile of B and C for twice the channels: bfloat16, n = 64); a first pass costs,
// per block and step, 0.5 of its second pass at n <= 16 and 0.65 above in the forward (an exponential per
// state dim and step, as in the second, without the output), 0.2 in the backward (the adjoint alone).
// Between near ties (3%) the fewer segments win, which need less workspace.
template <bool Backward>
inline void choose_plan(const ForwardParams& params, Plan& plan) {
  if (plan.family != Family::Lanes || params.length == 0) return;
  const int64_t sms = cuda::device_shape().multiprocessors, chunks = chunks_of(params.length);
  std::vector<LanePolicy> candidates{LanePolicy::Narrow};
  if (params.n <= 16 && blocks_of<Policy<4, 4>>(params) * chunks < 2 * sms)
    candidates = {LanePolicy::Single};  // too few blocks even split into every chunk
  else if (params.n > (Backward ? 64 : 16))
    candidates.push_back(LanePolicy::Wide);
  const double first_pass = Backward ? 0.2 : params.n > 16 ? 0.65 : 0.5;
  double best_time = std::numeric_limits<double>::infinity();
  for (const LanePolicy policy : candidates) {
    with_policy<Backward>(policy, params.n, [&]<typename Policy>() {
      const int64_t blocks = blocks_of<Policy>(params);
      const int64_t resident = Backward ? Policy::kBackwardResident : Policy::kForwardMinBlocks;
      const double step_cost = policy == LanePolicy::Wide ? 0.82 : 1.0;
      for (int64_t count = 1; count <= std::min<int64_t>(chunks, 64); ++count) {
        const int64_t segment_chunks = (chunks + count - 1) / count;
        const int64_t segments = (chunks + segment_chunks - 1) / segment_chunks;
        const double time = step_cost * static_cast<double>(segment_chunks) *
                            (pass_time<Backward>(blocks * segments, Policy::kWarps, resident, sms) +
                             first_pass * pass_time<Backward>(blocks * (segments - 1), Policy::kWarps, resident, sms));
        if (time < 0.97 * best_time) {
          best_time = time;
          plan.lane_policy = policy;
          plan.segment_chunks = segment_chunks;
          plan.segments = segments;
        }
      }
    });
  }
}

}  // namespace linrec::ssm::lanes
