// The gradient of broadcast coefficients, summed inside the backward kernels (BackwardParams::
// sum_d_coeffs) instead of written per element and reduced afterwards: every element's d_coeffs[l] is
// added into the coefficient it was read from, an accumulator-typed buffer in coeffs' shape.
// Elements that share a coefficient are first summed in registers, then across the threads that hold
// them, so that few atomic additions reach memory:
//   along time (coeffs broadcast along time: one per row, per channel, a scalar): a thread sums its
//     items over all its tiles, its sequence's threads sum theirs (across warps through shared memory),
//     and one addition per sequence and block remains, one per block where a warp's sequences share
//     the coefficient too;
//   across sequences only (one coefficient per (batch, time) shared by channels): with time strided,
//     a warp's lanes hold neighbouring sequences at the same steps, and where they share the
//     coefficients the warp sums each step before one addition; otherwise each element is added.
#pragma once

#include <cstdint>

#include "linrec/block_scan.h"  // shuffled
#include "linrec/numeric.h"

namespace linrec {

__device__ __forceinline__ void atomic_accumulate(float* address, float value) { atomicAdd(address, value); }
__device__ __forceinline__ void atomic_accumulate(double* address, double value) { atomicAdd(address, value); }
template <typename Real>
__device__ __forceinline__ void atomic_accumulate(Complex<Real>* address, Complex<Real> value) {
  atomicAdd(&address->re, value.re);
  atomicAdd(&address->im, value.im);
}
template <typename Real>
__device__ __forceinline__ void atomic_accumulate(ChannelPair<Real>* address, ChannelPair<Real> value) {
  atomicAdd(&address->first, value.first);
  atomicAdd(&address->second, value.second);
}

// The sum of `value` over the Width lanes of this lane's aligned group, in every lane of the group.
template <int Width, typename Acc>
__device__ __forceinline__ Acc group_sum(Acc value) {
  #pragma unroll
  for (int delta = Width / 2; delta >= 1; delta /= 2)
    value = value + shuffled(value, [delta](auto part) { return __shfl_xor_sync(0xffffffffu, part, delta); });
  return value;
}

// The sum, for a block whose sequences each take SegmentLanes lanes of each of SegmentWarps warps
// (SegmentLanes 1 where time is strided and a warp's lanes hold neighbouring sequences), each thread
// holding Items consecutive steps. Its state lives in shared memory and the coefficient's address is
// computed where it is used (`row()`, the thread's coefficient at time 0): registers kept for them
// through the scan loop would cost the summing kernels occupancy.
template <typename Acc, int SegmentLanes, int SegmentWarps, int Items, int BlockThreads>
struct CoeffGradientSum {
  static constexpr bool kLanesAcrossSequences = SegmentLanes == 1;

  // Called by every thread of the block before its first tile.
  __device__ __forceinline__ static void start(const Operand& d_coeffs) {
    if (d_coeffs.time_stride == 0) running() = Acc(0);
  }

  // Adds the thread's chunk, items[i] being the gradient at step begin + i of its row, which has
  // `length` steps (0 for a thread without a sequence; every row has `steps`). Called by every thread
  // of the warp together.
  template <typename Row>
  __device__ __forceinline__ static void add(const Operand& d_coeffs, Row row, int64_t steps,
                                             const Acc (&items)[Items], int64_t begin, int64_t length) {
    const int64_t time_stride = d_coeffs.time_stride;
    if (time_stride == 0) {
      Acc total = running();
      #pragma unroll
      for (int i = 0; i < Items; ++i)
        if (begin + i < length) total = total + items[i];
      running() = total;
      return;
    }
    Acc* const coeffs = row();
    if (kLanesAcrossSequences && shared_by_warp(coeffs)) {
      // The lanes hold the same steps (a warp takes one chunk of each of its sequences): the warp
      // sums each step, and one lane adds it.
      Acc values[Items];
      #pragma unroll
      for (int i = 0; i < Items; ++i) values[i] = begin + i < length ? items[i] : Acc(0);
      const int step = warp_sum_scatter(values);
      if (step >= 0 && begin + step < steps) atomic_accumulate(coeffs + (begin + step) * time_stride, values[0]);
    } else {
      #pragma unroll
      for (int i = 0; i < Items; ++i)
        if (begin + i < length) atomic_accumulate(coeffs + (begin + i) * time_stride, items[i]);
    }
  }

  // Adds the running sums along time once the block's tiles are done. Called by every thread of the
  // block together.
  template <typename Row>
  __device__ __forceinline__ static void finish(const Operand& d_coeffs, Row row) {
    if (d_coeffs.time_stride != 0) return;
    Acc* const coeffs = row();
    const bool warp_shares = kLanesAcrossSequences && shared_by_warp(coeffs);
    const int lane = threadIdx.x % 32;
    Acc total = group_sum<SegmentLanes>(running());
    if constexpr (kLanesAcrossSequences && SegmentWarps > 1) {
      // Warp w's lane holds the same sequence as every other warp's: the first warp sums them.
      __syncthreads();  // every running() is final
      if (threadIdx.x / 32 != 0) return;
      #pragma unroll
      for (int w = 1; w < SegmentWarps; ++w) total = total + running(w * 32 + lane);
    }
    if (warp_shares) total = group_sum<32>(total);
    const bool adds = kLanesAcrossSequences ? !warp_shares || lane == 0 : lane % SegmentLanes == 0;
    if (adds) atomic_accumulate(coeffs, total);
  }

 private:
  // A thread's running sum along time.
  __device__ __forceinline__ static Acc& running(int thread = threadIdx.x) {
    __shared__ Acc sums[BlockThreads];
    return sums[thread];
  }

  // Sums values[i] over the warp's lanes for every i: returns the index i whose sum this lane holds in
  // values[0], in one lane per item, and -1 in the others. Each round halves the items a lane holds: it keeps
  // the half its partner lane does not and adds the partner's copy of it, so that the warp exchanges
  // Items / 2 + Items / 4 + ... values a lane, where a separate sum per item would exchange 5 Items.
  __device__ __forceinline__ static int warp_sum_scatter(Acc (&values)[Items]) {
    static_assert((Items & (Items - 1)) == 0 && Items <= 32, "a power of 2 of items, at most a warp's lanes");
    const int lane = threadIdx.x % 32;
    int index = 0;
    #pragma unroll
    for (int half = Items / 2, delta = 16; half >= 1; half /= 2, delta /= 2) {
      const bool upper = lane & delta;
      #pragma unroll
      for (int j = 0; j < half; ++j) {
        const Acc sent = upper ? values[j] : values[j + half];
        const Acc kept = upper ? values[j + half] : values[j];
        values[j] = kept + shuffled(sent, [delta](auto part) { return __shfl_xor_sync(0xffffffffu, part, delta); });
      }
      index += upper ? half : 0;
    }
    // The lanes that agree on the bits used so far hold the same item: sum over the rest of the lanes.
    constexpr int kSharing = 32 / Items;
    values[0] = group_sum<kSharing>(values[0]);
    return lane % kSharing == 0 ? index : -1;
  }

  // Whether every lane of the warp adds into the same coefficients. Called by the whole warp.
  __device__ __forceinline__ static bool shared_by_warp(const Acc* address) {
    const auto bits = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(address));
    return __all_sync(0xffffffffu, bits == __shfl_sync(0xffffffffu, bits, 0));
  }
};

}  // namespace linrec
