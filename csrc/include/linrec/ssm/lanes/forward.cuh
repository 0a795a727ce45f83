// The lane kernels' forward (ssm/lanes/policy.cuh).
#pragma once

#include "linrec/ssm/lanes/segments.cuh"

namespace linrec::ssm::lanes {

template <typename Policy, bool Fixed>
struct __align__(16) ForwardShared {
  typename ProjectionTile<Policy, float>::Storage projections[Fixed ? 1 : 2];
  ChannelSteps<Policy, float2> steps[2];  // (dt, dt u)
  LanePartials<Policy> partial;
  alignas(16) FixedRows<Policy, Fixed> fixed_C;  // read 16 bytes at a time
};

// The forward, over one segment of each of the block's rows. Ends: the first pass of a split row,
// which scans each segment but the last from a zero state (or the row's initial one) and saves, per
// state dim, the state it ends in and the product of its decays (or kRestarted) in the
// workspace ([2][segment][row][n]); the second pass (!Ends) starts each segment from the state these
// give, and writes the outputs. Fixed: B and C fixed (d, n), kept in registers; else varying,
// moved through the block's tiles.
template <typename T, typename W, typename Policy, bool Packed, bool Fixed, bool Ends>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kForwardMinBlocks) forward_kernel(const ForwardParams p) {
  constexpr int kStates = Policy::kStates, kSteps = Policy::kSteps, kShare = Policy::kShare;
  enum { kDelta, kU, kZ, kRows };
  // Dynamic: eight warps' at n = 128 pass the 48 KB a static allocation may take.
  extern __shared__ __align__(16) unsigned char dynamic_storage[];
  auto& shared = *reinterpret_cast<ForwardShared<Policy, Fixed>*>(dynamic_storage);
  const Place<Policy> at(p);
  const ChannelView<Policy> ch{p, at};
  const Segment segment(p);
  const int64_t n = p.n, length = p.length, chunks = chunks_of(length);
  const int64_t first_tile = segment.begin / kSteps, tiles = (segment.end - segment.begin + kSteps - 1) / kSteps;
  const int64_t projection_row = (at.b * p.B.groups + at.group) * n * length;
  const W* B = Fixed ? nullptr : static_cast<const W*>(p.B.data) + projection_row;
  const W* C = Fixed || Ends ? nullptr : static_cast<const W*>(p.C.data) + projection_row;
  const auto row_of = [&](const void* data) { return data ? static_cast<const T*>(data) + at.row * length : nullptr; };
  const T* rows[kRows] = {row_of(p.delta), row_of(p.u), Ends ? nullptr : row_of(p.z)};
  T* out_row = static_cast<T*>(p.out) + at.row * length;
  float* checkpoints = static_cast<float*>(p.checkpoints) + at.row * chunks * n;
  // The workspace's [2][segment][row][n]: the segments' end states, then their decay products.
  float* ends = static_cast<float*>(p.workspace);
  float* decays = ends + (p.segments - 1) * p.batch * p.d * n;
  const auto segment_state = [&](int64_t s) { return (s * p.batch * p.d + at.row) * n; };

  const LaneConstants<Policy, Fixed> constants(ch, shared.fixed_C);
  const auto& A2 = constants.A2;
  const auto& lane_projections = constants.projections;
  const float bias = constants.bias, D = constants.D;
  const int dims = at.dims_below(n);
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
    if constexpr (!Fixed) projections.fetch(B, C, n, t0, length, p.vectorized);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) runs.fetch(r, rows[r], at.share_begin(t0), length, p.vectorized);
  };
  const auto commit = [&](int64_t t0, int buffer) {
    if constexpr (!Fixed) projections.commit(shared.projections[buffer]);
    #pragma unroll
    for (int r = 0; r < kRows; ++r) runs.unpack(r, now[r]);
    float dt[kShare], dtu[kShare];
    share_step_sizes<kShare>(p, now[kDelta], now[kU], at.share_begin(t0), bias, dt, dtu);
    if constexpr (Ends) add_step_sizes<kShare>(dt_sum, dt);
    if (at.stores_share()) {
      #pragma unroll
      for (int i = 0; i < kShare; ++i) shared.steps[buffer][at.slot][at.share_offset() + i] = make_float2(dt[i], dtu[i]);
    }
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
    const int buffer = (tile - first_tile) & 1, tile_buffer = Fixed ? 0 : buffer;
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
      float b[kStates], c[kStates];
      lane_projections.at(shared.projections[tile_buffer], t, at.state(0), b, c);
      const float y = step_dims<kStates, Policy::kPartialLanes>(h, A2, step.x, step.y, b, c, dims);
      if constexpr (!Ends) shared.partial[t][threadIdx.x] = output_term<Policy>(y, h, dims);
    }

    if constexpr (!Ends) {
      // The output: the lanes' partial sums added up per step, by the lane whose share the step is.
      __syncwarp();
      float y[kShare];
      if constexpr (Fixed) sum_outputs<Policy>(shared.partial, shared.fixed_C[Policy::kStates == 1 ? at.slot : 0], 0, at, y);
      else sum_outputs<Policy>(shared.partial, &shared.projections[tile_buffer][1][0][0], Policy::kMaxStates, at, y);
      #pragma unroll
      for (int i = 0; i < kShare; ++i) {
        y[i] = fmaf(D, now[kU][i], y[i]);
        if (p.z) y[i] *= silu(now[kZ][i]);
      }
      if (at.active && at.stores_share()) store_run<kShare>(out_row, at.share_begin(t0), length, p.vectorized, y);
    }
    if (tile + 1 < first_tile + tiles) commit(t0 + kSteps, buffer ^ 1);
    __syncthreads();
  }
  if constexpr (Ends) {
    save_segment<Policy>(ch, segment.index, ends, decays, h, dt_sum, restarted, A2);
  } else if (segment.end == length && length > 0) {
    ch.write_states(p.last_state, walk.sequence, h);
  }
}

}  // namespace linrec::ssm::lanes
