// Rows of the lane kernels split along time (ssm/lanes/policy.cuh): the segments, what a first pass
// carries between them, and the backward's workspace with the kernels that add up its partial sums in
// a fixed order.
#pragma once

#include <cstdint>

#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/lanes/sums.cuh"

namespace linrec::ssm::lanes {

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

// What the first pass saves of a segment (every lane of a channel calls it: segment_decays sums over
// them): per state dim, what it carries out (`end`: the state, or the adjoint) and the product of its
// decays, or kRestarted, at [segment][batch * d][n] of `ends` and `decays`.
template <typename Policy>
__device__ __forceinline__ void save_segment(const ChannelView<Policy>& ch, int64_t segment, float* ends, float* decays,
                                             const float (&end)[Policy::kStates], double lane_dt_sum, bool restarted,
                                             const float (&A2)[Policy::kStates]) {
  float decay[Policy::kStates];
  segment_decays<Policy>(lane_dt_sum, restarted, A2, decay);
  if (!ch.at.active) return;
  const int64_t first = (segment * ch.p.batch * ch.p.d + ch.at.row) * ch.p.n;
  #pragma unroll
  for (int i = 0; i < Policy::kStates; ++i) {
    if (ch.at.state(i) >= ch.p.n) continue;
    ends[first + ch.at.state(i)] = end[i];
    decays[first + ch.at.state(i)] = decay[i];
  }
}

// The state (or adjoint) h carried through a segment of the first pass's `decay` and `end`, as the
// steps carry it: a product of decays that underflowed to 0 leaves an infinite or NaN h as it is (each
// step's decay is positive), and a 0 h stays 0 through a product that overflowed.
__device__ __forceinline__ float carry_through(float h, float decay, float end) {
  if (decay == kRestarted) return end;
  const float carried = decay == 0.0f || h == 0.0f ? (isfinite(h) ? 0.0f : h) : decay * h;
  return carried + end;
}

// The backward workspace, in floats. Of a split row: [segment][batch * d][n] each of the adjoints a
// segment carries out of its first step (from a zero adjoint after it, the first pass) and of its
// decay products; then the segments' partial sums (SegmentSums), which sum_segments adds up. Of a
// deterministic backward: each block of channels' sums of varying B's and then C's gradient terms,
// [channel block][B's shape], which sum_channel_blocks adds up.
struct BackwardWorkspace {
  // The partial sums of a split row's segments, [segment][size]: d_A's, a fixed B's and C's gradients'
  // ([batch * d][n] each; the last two of size 0 where B and C vary), d_D's and d_delta_bias's
  // ([batch * d]).
  struct SegmentSums {
    float* parts;
    int64_t size;
    void* target;  // the gradient, or null
  };
  static constexpr int kSegmentSums = 5;

  float *carried, *decays;
  SegmentSums sums[kSegmentSums];
  float *d_B_parts, *d_C_parts;

  LINREC_HOST_DEVICE static int64_t projection_floats(const ForwardParams& p) {
    return p.batch * p.B.groups * p.n * p.length;
  }
  // The floats per segment of a split row's partial sums.
  LINREC_HOST_DEVICE static int64_t segment_sum_floats(const ForwardParams& p) {
    const int64_t rows = p.batch * p.d;
    return rows * ((p.B.varying ? 1 : 3) * p.n + 2);
  }
  LINREC_HOST_DEVICE static int64_t floats(const BackwardParams& p) {
    return (p.segments > 1 ? p.segments * (2 * p.batch * p.d * p.n + segment_sum_floats(p)) : 0) +
           2 * p.channel_blocks * projection_floats(p);
  }
  LINREC_HOST_DEVICE explicit BackwardWorkspace(const BackwardParams& p) {
    const int64_t segments = p.segments > 1 ? p.segments : 0, rows = p.batch * p.d, states = rows * p.n;
    const int64_t fixed_states = p.B.varying ? 0 : states;
    carried = static_cast<float*>(p.workspace);
    decays = carried + segments * states;
    const SegmentSums layout[kSegmentSums] = {{nullptr, states, p.d_A}, {nullptr, fixed_states, p.d_B},
                                              {nullptr, fixed_states, p.d_C}, {nullptr, rows, p.d_D},
                                              {nullptr, rows, p.d_delta_bias}};
    float* next = decays + segments * states;
    for (int i = 0; i < kSegmentSums; ++i) {
      sums[i] = layout[i];
      sums[i].parts = next;
      next += segments * layout[i].size;
    }
    d_B_parts = next;
    d_C_parts = d_B_parts + p.channel_blocks * projection_floats(p);
  }
  // Segment s's partial sums of d_A, a fixed d_B and a fixed d_C of a row's state dims, and of d_D and
  // d_delta_bias of a row.
  __device__ __forceinline__ float* d_A(int64_t s, int64_t row, int64_t n) const { return at(0, s, row * n); }
  __device__ __forceinline__ float* d_fixed_B(int64_t s, int64_t row, int64_t n) const { return at(1, s, row * n); }
  __device__ __forceinline__ float* d_fixed_C(int64_t s, int64_t row, int64_t n) const { return at(2, s, row * n); }
  __device__ __forceinline__ float* d_D(int64_t s, int64_t row) const { return at(3, s, row); }
  __device__ __forceinline__ float* d_delta_bias(int64_t s, int64_t row) const { return at(4, s, row); }

 private:
  __device__ __forceinline__ float* at(int which, int64_t s, int64_t offset) const {
    return sums[which].parts + s * sums[which].size + offset;
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

// The partial sums of a split row's segments, added up in segment order (deterministic), over
// BackwardWorkspace::segment_sum_floats elements.
__global__ void sum_segments(const BackwardParams p) {
  const BackwardWorkspace ws(p);
  const int64_t count = BackwardWorkspace::segment_sum_floats(p);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += gridDim.x * int64_t(blockDim.x)) {
    int which = 0;
    int64_t local = e;
    while (local >= ws.sums[which].size) local -= ws.sums[which++].size;
    const BackwardWorkspace::SegmentSums& sum = ws.sums[which];
    float total = 0.0f;
    for (int64_t s = 0; s < p.segments; ++s) total += sum.parts[s * sum.size + local];
    if (sum.target) static_cast<float*>(sum.target)[local] = total;
  }
}

}  // namespace linrec::ssm::lanes
