// The selective scan's decode step on the GPU (selective_state_update): one step of every (batch row,
// channel) from its row of a cache of states, the new state written back in place.
//
// A real float32 state with n <= 128 takes the lane kernels' arithmetic (ssm/lanes/), so that T
// steps give the bits of one scan of T steps: four state dims a lane (recur: the same decay, multiply-adds
// and chain), four lanes a channel up to n = 16, sixteen up to 64 and thirty-two up to 128, the lanes'
// chains added in sum_share's order, then D and the gate as the scan adds them. Any other state (n > 128,
// float64, complex) takes a warp a channel, its lanes striding over the state dims.
#pragma once

#include <cstdint>

#include "linrec/ssm/device_step.cuh"
#include "linrec/ssm/lanes/sums.cuh"
#include "linrec/ssm/params.h"
#include "linrec/ssm/step.h"

namespace linrec::ssm::step {

constexpr int kThreads = 128;

// The state dims of a lane's four, from state dim `first`, that lie below n.
__device__ __forceinline__ int valid_dims(int64_t n, int64_t first) {
  const int64_t valid = n - first;
  return valid < 0 ? 0 : valid > 4 ? 4 : static_cast<int>(valid);
}

// The per-step operands of channel k of batch row b: its step size (softplus of delta + bias where
// asked) and u, as the scan forms them (share_step_sizes, Channel::step_sizes).
template <typename T, typename R>
struct StepOperands {
  R u, dt, dtu;
  __device__ __forceinline__ StepOperands(const ForwardParams& p, int64_t row, R bias)
      : u(static_cast<R>(static_cast<const T*>(p.u)[row])),
        dt(step_size(static_cast<R>(static_cast<const T*>(p.delta)[row]), bias, p.delta_softplus)),
        dtu(dt * u) {}
};

// The output from the sum over the state dims, as the scan adds D's term and the gate.
template <typename T, typename R>
__device__ __forceinline__ void write_output(const ForwardParams& p, int64_t row, int64_t k, R y, R u) {
  const R D = p.D ? static_cast<const R*>(p.D)[k] : R(0);
  if constexpr (std::is_same_v<R, float>) y = fmaf(D, u, y);
  else y += D * u;
  if (p.z) y *= silu(static_cast<R>(static_cast<const T*>(p.z)[row]));
  static_cast<T*>(p.out)[row] = static_cast<T>(y);
}

// Element `index` of B or C in the state type S: a varying one stored in W (the values' type) converted,
// else (fixed, or varying in S; a complex state's always) as stored.
template <typename W, typename S>
__device__ __forceinline__ S projection_value(const Projection& M, int64_t index) {
  if constexpr (!is_complex<S>::value)
    if (M.varying && !M.wide) return static_cast<S>(static_cast<const W*>(M.data)[index]);
  return static_cast<const S*>(M.data)[index];
}

// Lanes lanes a channel, four state dims a lane: the lane kernels' Narrow policy for n <= 4 * Lanes.
template <typename T, typename W, int Lanes>
__global__ void __launch_bounds__(kThreads) lane_step_kernel(const StateUpdateParams p) {
  using Policy = lanes::Policy<Lanes, 4>;
  constexpr int kChannels = kThreads / Lanes;
  const int lane = threadIdx.x % Lanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kChannels + threadIdx.x / Lanes;  // b * d + k
  const bool active = row < p.batch * p.d;
  const int64_t b = active ? row / p.d : 0, k = active ? row % p.d : 0, n = p.n;
  const int64_t s = active ? p.sequences.state_row(b) : -1;
  const int valid = active ? valid_dims(n, lane * 4) : 0;
  // The lane's four state dims: one 16-byte access where they all lie below n and their state and A
  // start 16-byte aligned (n a multiple of 4), else one at a time.
  float* state = static_cast<float*>(p.last_state) + (s * p.d + k) * n + lane * 4;
  const float* A = static_cast<const float*>(p.A) + k * n + lane * 4;
  const bool vector = valid == 4 && (reinterpret_cast<uintptr_t>(state) | reinterpret_cast<uintptr_t>(A)) % 16 == 0;
  float h[4], A2[4];
  alignas(16) float B[4], C[4];  // recur reads them as 16-byte vectors
  if (vector) {
    const float4 a = *reinterpret_cast<const float4*>(A);
    A2[0] = a.x, A2[1] = a.y, A2[2] = a.z, A2[3] = a.w;
    const float4 x = s >= 0 ? *reinterpret_cast<const float4*>(state) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    h[0] = x.x, h[1] = x.y, h[2] = x.z, h[3] = x.w;
  } else {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      A2[i] = i < valid ? A[i] : 0.0f;
      h[i] = i < valid && s >= 0 ? state[i] : 0.0f;
    }
  }
  // B's and C's state dims follow each other (a step's varying ones, and fixed ones): one offset each.
  const int64_t B_first = p.B.offset(b, k, lane * 4, p.d, n, 1), C_first = p.C.offset(b, k, lane * 4, p.d, n, 1);
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    A2[i] = scaled_log2(A2[i]);
    B[i] = i < valid ? projection_value<W, float>(p.B, B_first + i) : 0.0f;
    C[i] = i < valid ? projection_value<W, float>(p.C, C_first + i) : 0.0f;
  }
  const StepOperands<T, float> step(p, active ? row : 0, active && p.delta_bias ? static_cast<const float*>(p.delta_bias)[k] : 0.0f);
  const float lane_chain = lanes::recur<4, true>(h, A2, step.dt, step.dtu, B, C, valid);
  if (s >= 0) {
    if (vector) {
      *reinterpret_cast<float4*>(state) = make_float4(h[0], h[1], h[2], h[3]);
    } else {
      #pragma unroll
      for (int i = 0; i < 4; ++i)
        if (i < valid) state[i] = h[i];
    }
  }
  // The channel's lanes' chains, added as sum_share adds them.
  float chains[Lanes];
  const int first = threadIdx.x % 32 - lane;
  #pragma unroll
  for (int l = 0; l < Lanes; ++l) chains[l] = __shfl_sync(0xffffffffu, lane_chain, first + l);
  float sum = 0.0f;
  #pragma unroll
  for (int quad = 0; quad < Lanes / 4; ++quad)
    sum += (chains[4 * quad] + chains[4 * quad + 1]) + (chains[4 * quad + 2] + chains[4 * quad + 3]);
  static_assert(Policy::kMaxStates == 4 * Lanes, "four state dims a lane");
  if (active && lane == 0) write_output<T, float>(p, row, k, sum, step.u);
}

// A warp a channel, lane l taking state dims l, l + 32, ...: any state type and n. The state dims go in
// tiles of kTile a lane, each tile's loads issued before its stores (which the compiler cannot move a
// load past), so that a warp keeps a tile's bytes in flight.
template <typename T, typename W, typename S>
__global__ void __launch_bounds__(kThreads) warp_step_kernel(const StateUpdateParams p) {
  using R = real_t<S>;
  constexpr int kChannels = kThreads / 32, kTile = 4;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kChannels + threadIdx.x / 32;
  if (row >= p.batch * p.d) return;  // the whole warp
  const int64_t b = row / p.d, k = row % p.d, n = p.n, s = p.sequences.state_row(b);
  S* state = static_cast<S*>(p.last_state) + (s * p.d + k) * n;
  const StepOperands<T, R> step(p, row, p.delta_bias ? static_cast<const R*>(p.delta_bias)[k] : R(0));
  // B's and C's state dims follow each other (a step's varying ones, and fixed ones): one offset each.
  const int64_t B_first = p.B.offset(b, k, 0, p.d, n, 1), C_first = p.C.offset(b, k, 0, p.d, n, 1);
  S sum{};
  for (int64_t first = lane; first < n; first += 32 * kTile) {
    S before[kTile], A[kTile], B[kTile], C[kTile];
    #pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int64_t j = first + 32 * i;
      const bool present = j < n;
      before[i] = present && s >= 0 ? state[j] : S{};
      A[i] = present ? static_cast<const S*>(p.A)[k * n + j] : S{};
      B[i] = present ? projection_value<W, S>(p.B, B_first + j) : S{};
      C[i] = present ? projection_value<W, S>(p.C, C_first + j) : S{};
    }
    #pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int64_t j = first + 32 * i;
      if (j >= n) continue;
      const S after = decay_from_log2(step.dt, scaled_log2(A[i])) * before[i] + step.dtu * B[i];
      if (s >= 0) state[j] = after;
      sum += C[i] * after;
    }
  }
  sum = warp_sum(sum);
  if (lane == 0) write_output<T, R>(p, row, k, readout(sum), step.u);
}

}  // namespace linrec::ssm::step
