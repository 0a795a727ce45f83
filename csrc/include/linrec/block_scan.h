// The scan primitive every parallel kernel shares: a segment of ThreadsPerSequence threads, each
// holding Items consecutive elements, scans them as one tile, starting from a carried output.
// Within a thread the recurrence runs sequentially; across threads the affine maps
// y -> coeff * y + value are composed by a warp-shuffle scan, and across warps through shared
// memory. Reverse scans from the last element to the first (threads and items in reverse order).
#pragma once

#include <cstdint>

#include "linrec/numeric.h"

namespace linrec {

// A warp shuffle of any accumulator: complex values move as their two parts.
template <typename Acc, typename Shuffle>
__device__ __forceinline__ Acc shuffled(const Acc& value, Shuffle shuffle) {
  if constexpr (is_complex<Acc>::value) return Acc(shuffle(value.re), shuffle(value.im));
  else return shuffle(value);
}

template <typename Acc>
struct Affine {  // y -> coeff * y + value
  Acc coeff;
  Acc value;
};

// The map that applies `earlier`, then `later`.
template <typename Acc>
__device__ __forceinline__ Affine<Acc> then(const Affine<Acc>& earlier, const Affine<Acc>& later) {
  return {later.coeff * earlier.coeff, later.coeff * earlier.value + later.value};
}

template <int ThreadsPerSequence, int Items, bool Reverse>
struct TileScan {
  static constexpr int kWarp = 32;
  static constexpr int kSegmentWidth = ThreadsPerSequence < kWarp ? ThreadsPerSequence : kWarp;
  static constexpr int kWarpsPerSequence = ThreadsPerSequence / kSegmentWidth;
  static_assert(ThreadsPerSequence % kSegmentWidth == 0 && (kSegmentWidth & (kSegmentWidth - 1)) == 0,
                "ThreadsPerSequence must be a power of two");

  template <typename Acc>
  struct Storage {  // per-warp aggregates, used when a sequence spans several warps
    Affine<Acc> warp_total[kWarpsPerSequence > 1 ? kWarpsPerSequence : 1];
  };

  // The value `delta` threads earlier in scan order, within the segment.
  template <typename Acc>
  __device__ __forceinline__ static Acc from_earlier(const Acc& value, int delta) {
    return shuffled(value, [delta](auto part) {
      if constexpr (Reverse) return __shfl_down_sync(0xffffffffu, part, delta, kSegmentWidth);
      else return __shfl_up_sync(0xffffffffu, part, delta, kSegmentWidth);
    });
  }

  // The value of lane `source` of the segment.
  template <typename Acc>
  __device__ __forceinline__ static Acc from_lane(const Acc& value, int source) {
    return shuffled(value, [source](auto part) { return __shfl_sync(0xffffffffu, part, source, kSegmentWidth); });
  }

  // Scans value[] with coeff[] in place, starting from `carry` (the output before this tile in
  // scan order), and advances `carry` to the tile's last output. thread_rank is the thread's
  // index within its sequence's segment. All threads of the block must call it (it may sync).
  template <typename Acc>
  __device__ __forceinline__ static void scan(Acc (&value)[Items], Acc (&coeff)[Items], Acc& carry,
                                              int thread_rank, Storage<Acc>& storage) {
    // 1. Sequentially within the thread; coeff[] becomes the cumulative product.
    #pragma unroll
    for (int n = 1; n < Items; ++n) {
      const int i = Reverse ? Items - 1 - n : n, prev = Reverse ? i + 1 : i - 1;
      value[i] = coeff[i] * value[prev] + value[i];
      coeff[i] = coeff[i] * coeff[prev];
    }
    const int last = Reverse ? 0 : Items - 1;
    Affine<Acc> running{coeff[last], value[last]};

    // 2. Inclusive scan of the threads' maps across the warp segment, in scan order.
    const int lane = thread_rank % kSegmentWidth;
    const int rank = Reverse ? kSegmentWidth - 1 - lane : lane;
    #pragma unroll
    for (int delta = 1; delta < kSegmentWidth; delta *= 2) {
      const Affine<Acc> earlier{from_earlier(running.coeff, delta), from_earlier(running.value, delta)};
      if (rank >= delta) running = then(earlier, running);
    }
    Affine<Acc> exclusive{from_earlier(running.coeff, 1), from_earlier(running.value, 1)};
    if (rank == 0) exclusive = {Acc(1), Acc(0)};
    const int last_lane = Reverse ? 0 : kSegmentWidth - 1;
    Affine<Acc> total{from_lane(running.coeff, last_lane), from_lane(running.value, last_lane)};

    // 3. Across the warps of one sequence: compose the earlier warps' totals.
    if constexpr (kWarpsPerSequence > 1) {
      const int warp = thread_rank / kWarp;
      const int warp_rank = Reverse ? kWarpsPerSequence - 1 - warp : warp;
      if (lane == last_lane) storage.warp_total[warp_rank] = total;
      __syncthreads();
      Affine<Acc> before_warp{Acc(1), Acc(0)};
      for (int w = 0; w < warp_rank; ++w) before_warp = then(before_warp, storage.warp_total[w]);
      exclusive = then(before_warp, exclusive);
      total = before_warp;
      for (int w = warp_rank; w < kWarpsPerSequence; ++w) total = then(total, storage.warp_total[w]);
      __syncthreads();  // the next tile reuses storage
    }

    // 4. Every element gets the output before its thread's chunk.
    const Acc before_chunk = exclusive.coeff * carry + exclusive.value;
    #pragma unroll
    for (int i = 0; i < Items; ++i) value[i] = coeff[i] * before_chunk + value[i];
    carry = total.coeff * carry + total.value;
  }
};

}  // namespace linrec
