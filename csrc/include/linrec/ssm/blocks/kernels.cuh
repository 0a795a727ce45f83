// The block family's forward and backward kernels (ssm/blocks/policy.cuh).
#pragma once

#include "linrec/ssm/blocks/agent.cuh"

namespace linrec::ssm {

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
