// The lane kernels' backward (ssm/lanes/policy.cuh).
#pragma once

#include <type_traits>

#include "linrec/ssm/lanes/segments.cuh"

namespace linrec::ssm::lanes {

// A varying B's or C's gradient terms of a tile, [slot][step][state dim].
template <typename Policy>
using GradientTerms = float[Policy::kChannels][Policy::kTermStride];

struct NoTerms {};

template <typename Policy, bool Fixed>
struct __align__(16) BackwardShared {
  typename ProjectionTile<Policy, float>::Storage projections[Fixed ? 1 : 2];
  // (dt, dt u, dy, unused), dy = d out * silu(z) the gradient of the ungated output.
  ChannelSteps<Policy, float4> steps[2];
  LanePartials<Policy> partial[2];
  // None where B and C are fixed: a lane sums its own.
  std::conditional_t<Fixed, NoTerms, GradientTerms<Policy>> terms;
  alignas(16) FixedRows<Policy, Fixed> fixed_C;  // read 16 bytes at a time
};

// Adds the block's terms of a varying projection's gradient over its channels, in a fixed order, and
// the sums across blocks with a 16-byte atomic add (sm_90), or stores them (`store`: the block's own
// part of a deterministic backward's workspace): per state dim and four steps, kSplit neighbouring
// threads each add every kSplit-th slot, then their sums. Idle slots' terms are zeros.
template <typename Policy>
__device__ __forceinline__ void add_terms(const GradientTerms<Policy>& terms, float* gradient, int64_t n, int64_t t0,
                                          int64_t length, bool aligned, bool store) {
  constexpr int kOutputs = Policy::kMaxStates * Policy::kSteps / 4;
  constexpr int kSplit = Policy::kThreads > kOutputs ? Policy::kThreads / kOutputs : 1;
  static_assert(kSplit == 1 || kSplit == 2 || kSplit == 4 || kSplit == 8, "up to eight threads share an output");
  #pragma unroll
  for (int first = 0; first < kOutputs * kSplit; first += Policy::kThreads) {
    const int o = (first + threadIdx.x) / kSplit, part = threadIdx.x % kSplit;
    const int j = o % Policy::kMaxStates, quad = o / Policy::kMaxStates;
    float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (int slot = part; slot < Policy::kChannels; slot += kSplit) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) sums[e] += terms[slot][(4 * quad + e) * Policy::kMaxStates + j];
    }
    #pragma unroll
    for (int offset = 1; offset < kSplit; offset *= 2) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) sums[e] += __shfl_xor_sync(0xffffffffu, sums[e], offset);
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

// The backward, over one segment of each of the block's rows. Ends: the first pass of a split row,
// which walks each segment but the first back with the adjoint alone, from a zero adjoint after it
// (or a sequence's last-state gradient), and saves what it carries out of its first step and the
// product of its decays (or kRestarted); the second pass (!Ends) starts each segment from
// the adjoint these give. Fixed: B and C fixed (d, n), kept in registers, their gradients summed per
// lane over the steps, as A's is; else varying, moved through the block's tiles, their gradient terms
// summed over the block's channels and then across blocks.
template <typename T, typename W, typename Policy, bool Packed, bool Fixed, bool Ends>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kBackwardMinBlocks) backward_kernel(const BackwardParams p) {
  constexpr int kStates = Policy::kStates, kSteps = Policy::kSteps, kShare = Policy::kShare,
                kTilesPerChunk = Policy::kTilesPerChunk;
  enum { kDelta, kU, kZ, kOut, kRows };
  extern __shared__ __align__(16) unsigned char dynamic_storage[];
  auto& shared = *reinterpret_cast<BackwardShared<Policy, Fixed>*>(dynamic_storage);
  const Place<Policy> at(p);
  const ChannelView<Policy> ch{p, at};
  // The first pass takes segments 1, 2, ... (grid y + 1): the first one's carry is not needed.
  Segment segment(p);
  if (Ends) segment = Segment(p, segment.index + 1);
  const int64_t n = p.n, length = p.length, tiles = (length + kSteps - 1) / kSteps, chunks = chunks_of(length);
  const int64_t projection_row = (at.b * p.B.groups + at.group) * n * length;
  const W* B = Fixed ? nullptr : static_cast<const W*>(p.B.data) + projection_row;
  const W* C = Fixed ? nullptr : static_cast<const W*>(p.C.data) + projection_row;
  const BackwardWorkspace ws(p);
  const auto segment_state = [&](int64_t s) { return (s * p.batch * p.d + at.row) * n; };
  // A deterministic backward's blocks store their sums apart (their own part of the workspace).
  const bool store_terms = p.channel_blocks > 0;
  const int64_t part = store_terms ? at.channel_block * BackwardWorkspace::projection_floats(p) : 0;
  float* d_B = Fixed ? nullptr : (store_terms ? ws.d_B_parts + part : static_cast<float*>(p.d_B)) + projection_row;
  float* d_C = Fixed ? nullptr : (store_terms ? ws.d_C_parts + part : static_cast<float*>(p.d_C)) + projection_row;
  const auto row_of = [&](const void* data) { return data ? static_cast<const T*>(data) + at.row * length : nullptr; };
  const T* rows[kRows] = {row_of(p.delta), row_of(p.u), row_of(p.z), row_of(p.d_out)};
  T* d_u_row = static_cast<T*>(p.d_u) + at.row * length;
  T* d_delta_row = static_cast<T*>(p.d_delta) + at.row * length;
  T* d_z_row = p.z ? static_cast<T*>(p.d_z) + at.row * length : nullptr;
  const float* checkpoints = static_cast<const float*>(p.saved_checkpoints) + at.row * chunks * n;

  const LaneConstants<Policy, Fixed> constants(ch, shared.fixed_C);
  const auto& A = constants.A;
  const auto& A2 = constants.A2;
  const auto& lane_projections = constants.projections;
  const float bias = constants.bias, D = constants.D;
  const int dims = at.dims_below(n);
  const int lanes_below = static_cast<int>((n + kStates - 1) / kStates);  // the lanes holding dims below n
  if (!Ends && segment.index == 0) ch.copy_empty_sequences(p.d_last_state, p.d_initial);

  // The reverse walk: the sequence of the current step and its first step; the adjoint carried back
  // from the step after (exp(dt A) g there), which starts from a sequence's last-state gradient where
  // the segment ends one, else from the later segments' (the first pass's) or zero (in it).
  ReverseWalk<Packed> back(ch, p.d_last_state, segment.begin, segment.end);
  const bool ends_sequence = segment.end == length || (Packed && ch.next_start(back.sequence) == segment.end);
  float carried[kStates], d_A[kStates];
  float d_fixed_B[Fixed ? kStates : 1] = {}, d_fixed_C[Fixed ? kStates : 1] = {};  // over the steps (Fixed)
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
    if constexpr (!Fixed) projections.fetch(B, adjoint ? C : nullptr, n, t0, length, p.vectorized);
    #pragma unroll
    for (int r = 0; r < kRows; ++r)
      runs.fetch(r, adjoint || r == kDelta || r == kU ? rows[r] : nullptr, at.share_begin(t0), length, p.vectorized);
  };
  const auto commit = [&](int64_t t0, bool adjoint, int buffer) {
    if constexpr (!Fixed) projections.commit(shared.projections[buffer]);
    #pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (adjoint || r == kDelta || r == kU) runs.unpack(r, now[r]);
    float dt[kShare], dtu[kShare];
    share_step_sizes<kShare>(p, now[kDelta], now[kU], at.share_begin(t0), bias, dt, dtu);
    if constexpr (Ends) add_step_sizes<kShare>(dt_sum, dt);
    #pragma unroll
    for (int i = 0; i < kShare; ++i) {
      const float dy = !adjoint ? 0.0f : p.z ? now[kOut][i] * silu(now[kZ][i]) : now[kOut][i];
      if (at.stores_share()) shared.steps[buffer][at.slot][at.share_offset() + i] = make_float4(dt[i], dtu[i], dy, 0.0f);
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
    const auto& tile = shared.projections[Fixed ? 0 : buffer];
    const auto ignore = [](int64_t, const float (&)[kStates]) {};

    if (Ends) {
      // The adjoint alone, from the tile's last step to its first.
      #pragma unroll 4
      for (int t = kSteps - 1; t >= 0; --t) {
        if (back.before_step(ch, t0 + t, carried)) restarted = true;
        float b[kStates], c[kStates];
        lane_projections.at(tile, t, at.state(0), b, c);
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
        float b[kStates], c[kStates];
        lane_projections.at(tile, t, at.state(0), b, c);
        step_dims<kStates, Policy::kPartialLanes>(h, A2, step.x, step.y, b, c, dims);
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
        float b[kStates], c[kStates];
        lane_projections.at(tile, t, at.state(0), b, c);
        const float lane_chain = step_dims<kStates, Policy::kPartialLanes>(x, A2, step.x, step.y, b, c, dims);
        shared.partial[0][t][threadIdx.x] = output_term<Policy>(lane_chain, x, dims);
        float terms[kStates];
        #pragma unroll
        for (int i = 0; i < kStates; ++i) {
          states[t][i] = x[i];
          terms[i] = at.active ? step.z * x[i] : 0.0f;
        }
        if constexpr (Fixed) {
          // Steps past the length (dy = 0) are left out: their state may be infinite.
          if (t0 + t < length) {
            #pragma unroll
            for (int i = 0; i < kStates; ++i) d_fixed_C[i] += terms[i];
          }
        } else {
          store_floats<kStates>(&shared.terms[at.slot][t * Policy::kMaxStates + at.state(0)], terms);
        }
      }
      __syncthreads();
      float y[kShare];
      if constexpr (Fixed) {
        sum_outputs<Policy>(shared.partial[0], shared.fixed_C[kStates == 1 ? at.slot : 0], 0, at, y);
      } else {
        add_terms<Policy>(shared.terms, d_C, n, t0, length, p.vectorized, store_terms);
        sum_outputs<Policy>(shared.partial[0], &tile[1][0][0], Policy::kMaxStates, at, y);
      }
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
        lane_projections.at(tile, t, at.state(0), b, c);
        const float4 step_values = steps[t];
        const float dt = step_values.x, dtu = step_values.y, dy = step_values.z;
        float q_step = 0.0f, r_step = 0.0f;
        #pragma unroll
        for (int i = 0; i < kStates; ++i) {
          const float a = decay_from_log2(dt, A2[i]);
          const float g = dy * c[i] + carried[i];   // the adjoint of the state after the step
          const float g_decayed = g * a * prior[i];  // d / d(dt A) of the step
          d_A[i] += g_decayed * dt;
          if (!Policy::kPartialLanes || i < dims) {  // a partial lane's dims past n left out (chain)
            r_step += g_decayed * A[i];
            q_step += g * b[i];
          }
          terms[i] = at.active ? g * dtu : 0.0f;
          carried[i] = a * g;
        }
        shared.partial[0][t][threadIdx.x] = q_step;
        shared.partial[1][t][threadIdx.x] = r_step;
        if constexpr (Fixed) {
          if (step < length) {
            #pragma unroll
            for (int i = 0; i < kStates; ++i) d_fixed_B[i] += terms[i];
          }
        } else {
          store_floats<kStates>(&shared.terms[at.slot][t * Policy::kMaxStates + at.state(0)], terms);
        }
        if (step == back.first_step) ch.write_states(p.d_initial, back.sequence, carried);
      }
      __syncthreads();
      if constexpr (!Fixed) add_terms<Policy>(shared.terms, d_B, n, t0, length, p.vectorized, store_terms);
      float q_sum[kShare], r_sum[kShare], d_u[kShare], d_delta[kShare], d_z[kShare];
      // Lanes past n (NaN at an infinite dt or dt u) count as 0; a partial lane's sums left its dims past
      // n out above.
      sum_share<Policy>(shared.partial[0], at, q_sum, lanes_below);
      sum_share<Policy>(shared.partial[1], at, r_sum, lanes_below);
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
      if (at.active && at.stores_share()) {
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
    save_segment<Policy>(ch, segment.index, ws.carried, ws.decays, carried, dt_sum, restarted, A2);
    return;
  }
  // The per-row partial sums (per segment of a split row): d_A (and fixed d_B and d_C) per lane, d_D
  // and d_delta_bias over the channel's lanes.
  sum_D = channel_sum<Policy>(sum_D);
  sum_delta_bias = channel_sum<Policy>(sum_delta_bias);
  if (!at.active) return;
  const bool split = p.segments > 1;
  float* partial_A = split ? ws.d_A(segment.index, at.row, n) : static_cast<float*>(p.d_A) + at.row * n;
  #pragma unroll
  for (int i = 0; i < kStates; ++i)
    if (at.state(i) < n) partial_A[at.state(i)] = d_A[i];
  if constexpr (Fixed) {
    float* partial_B = split ? ws.d_fixed_B(segment.index, at.row, n) : static_cast<float*>(p.d_B) + at.row * n;
    float* partial_C = split ? ws.d_fixed_C(segment.index, at.row, n) : static_cast<float*>(p.d_C) + at.row * n;
    #pragma unroll
    for (int i = 0; i < kStates; ++i) {
      if (at.state(i) >= n) continue;
      partial_B[at.state(i)] = d_fixed_B[i];
      partial_C[at.state(i)] = d_fixed_C[i];
    }
  }
  if (at.lane == 0) {
    if (p.d_D) *(split ? ws.d_D(segment.index, at.row) : static_cast<float*>(p.d_D) + at.row) = sum_D;
    if (p.d_delta_bias)
      *(split ? ws.d_delta_bias(segment.index, at.row) : static_cast<float*>(p.d_delta_bias) + at.row) = sum_delta_bias;
  }
}

}  // namespace linrec::ssm::lanes
