// The scan primitive every parallel kernel shares: a segment of threads, each holding Items
// consecutive elements of one sequence, scans them as one tile, starting from the output before the
// tile that a prefix hook supplies (carried from the previous tile, or looked back at across blocks).
// Within a thread the recurrence runs sequentially; across threads the affine maps
// y -> coeff * y + value are composed by a warp-shuffle scan, and across warps through shared
// memory. Reverse scans from the last element to the first (threads and items in reverse order).
//
// For float32 (Compensated: kCompensated, numeric.h) the maps composed across threads carry the
// rounding error of their coefficient, so that the carries from thread to thread and tile to tile do not compound
// the rounding of products that a repeated decay makes the same everywhere: with one decay near 1 a row,
// the uncompensated scan's error was 10x the sequential loop's. Within a thread the products of its
// Items coefficients are rounded as they are, once each.
#pragma once

#include <cstdint>

#include "linrec/numeric.h"

namespace linrec {

// A warp shuffle of any accumulator: complex values and channel pairs move as their two parts.
template <typename Acc, typename Shuffle>
__device__ __forceinline__ Acc shuffled(const Acc& value, Shuffle shuffle) {
  if constexpr (is_complex<Acc>::value) return Acc(shuffle(value.re), shuffle(value.im));
  else if constexpr (is_channel_pair<Acc>::value) return Acc(shuffle(value.first), shuffle(value.second));
  else return shuffle(value);
}

template <typename Acc>
struct Affine {  // y -> (coeff + error) * y + value
  Acc coeff;
  Acc value;
  Acc error;  // the rounding error of coeff, a product of coefficients (Compensated; else 0)
};

template <typename Acc>
__device__ __forceinline__ Affine<Acc> identity_map() {
  return {Acc(1), Acc(0), Acc(0)};
}

// The map applied to `state`. Resets: a zero coefficient drops the state (advance(), numeric.h), as a
// sequence start needs; without, the plain multiply-add of the loop.
template <bool Compensated, typename Acc, bool Resets = true>
__device__ __forceinline__ Acc apply(const Affine<Acc>& map, const Acc& state) {
  if constexpr (Compensated) return advance(map.coeff, map.error, state, map.value);
  else if constexpr (Resets) return advance(map.coeff, state, map.value);
  else return map.coeff * state + map.value;
}

// The map that applies `earlier`, then `later`. With Resets, a later map with coefficient 0 (one that
// holds a sequence start) is constant: it ignores the earlier one, non-finite values included.
template <bool Compensated, typename Acc, bool Resets = true>
__device__ __forceinline__ Affine<Acc> then(const Affine<Acc>& earlier, const Affine<Acc>& later) {
  if constexpr (!Resets && !Compensated) return {later.coeff * earlier.coeff, later.coeff * earlier.value + later.value, Acc(0)};
  const Acc coeff = compose_coefficients(later.coeff, earlier.coeff);
  if constexpr (Compensated)
    return {coeff, apply<true>(later, earlier.value), product_error(later.coeff, later.error, earlier.coeff, earlier.error, coeff)};
  else return {coeff, advance(later.coeff, earlier.value, later.value), Acc(0)};
}

// A map's parts moved by a warp shuffle (the error only where it is carried).
template <bool Compensated, typename Acc, typename Shuffle>
__device__ __forceinline__ Affine<Acc> shuffled(const Affine<Acc>& map, Shuffle shuffle) {
  return {shuffled(map.coeff, shuffle), shuffled(map.value, shuffle), Compensated ? shuffled(map.error, shuffle) : Acc(0)};
}

// Inclusive scan of maps across a segment of Width lanes of a warp (every lane calls it), in scan
// order: lane order, or reversed. Returns the composition of the maps from the segment's first
// (in scan order) up to this lane's.
template <int Width, bool Reverse, bool Compensated, typename Acc, bool Resets = true>
__device__ __forceinline__ Affine<Acc> segment_inclusive_scan(Affine<Acc> running) {
  const int rank = Reverse ? Width - 1 - threadIdx.x % Width : threadIdx.x % Width;
  #pragma unroll
  for (int delta = 1; delta < Width; delta *= 2) {
    const auto earlier_part = [delta](auto part) {
      if constexpr (Reverse) return __shfl_down_sync(0xffffffffu, part, delta, Width);
      else return __shfl_up_sync(0xffffffffu, part, delta, Width);
    };
    const Affine<Acc> earlier = shuffled<Compensated>(running, earlier_part);
    if (rank >= delta) running = then<Compensated, Acc, Resets>(earlier, running);
  }
  return running;
}

// The running prefix of a pipe: the segment's threads carry the output before the next tile
// themselves, tile after tile (each thread its own copy; no synchronization).
template <typename Acc, bool Compensated>
struct RunningPrefix {
  Acc carry = Acc(0);
  __device__ __forceinline__ Acc operator()(const Affine<Acc>& tile_total) {
    const Acc before = carry;
    carry = apply<Compensated>(tile_total, carry);
    return before;
  }
};

// A sequence's segment is SegmentLanes consecutive lanes in each of SegmentWarps consecutive warps
// of the block; thread rank = warp * SegmentLanes + lane within the segment. Sequences along the
// contiguous dim take a run of lanes (SegmentLanes = threads per sequence up to a warp); sequences
// across it (time strided, channels contiguous) take one lane in each of several warps
// (SegmentLanes = 1), so that a warp's 32 lanes read 32 neighbouring channels.
//
// Resets: a zero coefficient drops the state before it (advance(), numeric.h), as a sequence start
// needs; without (a kernel whose tiles hold no start but a row's first step, whose carry is finite), the
// maps compose as the loop steps, one multiply-add each.
//
// Alternating: the caller alternates between two Storage objects from one scan to the next (or between
// two TileScans' storages), so that a scan need not wait, after reading the warps' totals, for every
// thread to have read them: the next scan writes the other storage, and the one after waits on the
// next scan's barrier first. One barrier a scan instead of two.
template <int SegmentLanes, int SegmentWarps, int Items, bool Reverse, bool Compensated, bool Resets = true,
          bool Alternating = false>
struct TileScan {
  static constexpr bool kCompensated = Compensated;
  static constexpr int kWarp = 32;
  static constexpr int kSequencesPerWarp = kWarp / SegmentLanes;
  static_assert(SegmentLanes <= kWarp && (SegmentLanes & (SegmentLanes - 1)) == 0,
                "SegmentLanes must be a power of two up to a warp");
  static_assert(SegmentWarps == 1 || SegmentLanes == kWarp || SegmentLanes == 1,
                "a segment over several warps takes whole warps or one lane of each");

  template <typename Acc>
  struct Storage {  // per-warp aggregates, used when a sequence spans several warps
    Affine<Acc> warp_total[SegmentWarps > 1 ? SegmentWarps : 1][SegmentWarps > 1 ? kSequencesPerWarp : 1];
  };

  // The map `delta` threads earlier in scan order, within the warp segment.
  template <typename Acc>
  __device__ __forceinline__ static Affine<Acc> from_earlier(const Affine<Acc>& map, int delta) {
    return shuffled<Compensated>(map, [delta](auto part) {
      if constexpr (Reverse) return __shfl_down_sync(0xffffffffu, part, delta, SegmentLanes);
      else return __shfl_up_sync(0xffffffffu, part, delta, SegmentLanes);
    });
  }

  // The map of lane `source` of the warp segment.
  template <typename Acc>
  __device__ __forceinline__ static Affine<Acc> from_lane(const Affine<Acc>& map, int source) {
    return shuffled<Compensated>(map, [source](auto part) { return __shfl_sync(0xffffffffu, part, source, SegmentLanes); });
  }

  // Scans value[] with coeff[] in place. prefix(tile_total) is called once by every thread with
  // the map of its sequence's whole tile and returns the output before the tile in scan order
  // (RunningPrefix, or a look-back across blocks). All threads of the block must call scan (it may
  // synchronize the block).
  //
  // `resets`: whether this thread's items hold a reset (a coefficient set to 0 at a sequence start,
  // sequence_starts.h). Only such threads take the reset path item by item (advance(), two more
  // instructions an item); the others multiply and add as the loop does, which differs from it only
  // where a non-finite state meets a zero coefficient, and such results are rescanned
  // (nonfinite_rescan.h).
  template <typename Acc, typename Prefix>
  __device__ __forceinline__ static void scan(Acc (&value)[Items], Acc (&coeff)[Items], Storage<Acc>& storage,
                                              Prefix& prefix, bool resets = true) {
    scan<false>(value, coeff, value, storage, prefix, resets);
  }

  // scan() of items whose coefficients are products with the rounding errors coeff_error[] (the chunk
  // maps of a look-back), where ItemErrors.
  template <bool ItemErrors, typename Acc, typename Prefix>
  __device__ __forceinline__ static void scan(Acc (&value)[Items], Acc (&coeff)[Items], const Acc (&coeff_error)[Items],
                                              Storage<Acc>& storage, Prefix& prefix, bool resets = true) {
    constexpr bool kErrors = ItemErrors && Compensated;
    const bool item_resets = Resets && resets;
    // 1. Sequentially within the thread; coeff[] becomes the cumulative product, `error` the rounding
    // error of the last (the thread's map), where carried.
    const int first = Reverse ? Items - 1 : 0;
    Acc error = kErrors ? coeff_error[first] : Acc(0);
    if (kErrors || item_resets) {
      #pragma unroll
      for (int n = 1; n < Items; ++n) {
        const int i = Reverse ? Items - 1 - n : n, prev = Reverse ? i + 1 : i - 1;
        const Acc item_error = kErrors ? coeff_error[i] : Acc(0);
        if constexpr (kErrors) value[i] = advance(coeff[i], item_error, value[prev], value[i]);
        else if constexpr (Resets) value[i] = advance(coeff[i], value[prev], value[i]);
        else value[i] = coeff[i] * value[prev] + value[i];
        const Acc product = Resets ? compose_coefficients(coeff[i], coeff[prev]) : coeff[i] * coeff[prev];
        if constexpr (kErrors) error = product_error(coeff[i], item_error, coeff[prev], error, product);
        else if constexpr (Compensated) error = product_error(coeff[i], coeff[prev], error, product);
        coeff[i] = product;
      }
    } else {
      #pragma unroll
      for (int n = 1; n < Items; ++n) {
        const int i = Reverse ? Items - 1 - n : n, prev = Reverse ? i + 1 : i - 1;
        value[i] = coeff[i] * value[prev] + value[i];
        const Acc product = coeff[i] * coeff[prev];
        if constexpr (Compensated) error = plain_product_error(coeff[i], coeff[prev], error, product);
        coeff[i] = product;
      }
    }
    const int last = Reverse ? 0 : Items - 1;
    // A product that ends at 0 is a constant map, whose error is 0 (product_error).
    if constexpr (Compensated && !kErrors) error = is_zero(coeff[last]) ? Acc(0) : error;
    Affine<Acc> running{coeff[last], value[last], error};

    // 2. Inclusive scan of the threads' maps across the warp segment, in scan order.
    const int lane = threadIdx.x % kWarp;
    const int segment_lane = lane % SegmentLanes;
    const int rank = Reverse ? SegmentLanes - 1 - segment_lane : segment_lane;
    running = segment_inclusive_scan<SegmentLanes, Reverse, Compensated, Acc, Resets>(running);
    Affine<Acc> exclusive = from_earlier(running, 1);
    if (rank == 0) exclusive = identity_map<Acc>();
    const int last_lane = Reverse ? 0 : SegmentLanes - 1;
    Affine<Acc> total = from_lane(running, last_lane);

    // 3. Across the warps of one sequence: compose the earlier warps' totals.
    if constexpr (SegmentWarps > 1) {
      const int warp = threadIdx.x / kWarp % SegmentWarps;
      const int warp_rank = Reverse ? SegmentWarps - 1 - warp : warp;
      const int sequence = lane / SegmentLanes;
      if (segment_lane == last_lane) storage.warp_total[warp_rank][sequence] = total;
      __syncthreads();
      Affine<Acc> before_warp = identity_map<Acc>();
      for (int w = 0; w < warp_rank; ++w)
        before_warp = then<Compensated, Acc, Resets>(before_warp, storage.warp_total[w][sequence]);
      exclusive = then<Compensated, Acc, Resets>(before_warp, exclusive);
      total = before_warp;
      for (int w = warp_rank; w < SegmentWarps; ++w) total = then<Compensated, Acc, Resets>(total, storage.warp_total[w][sequence]);
      if constexpr (!Alternating) __syncthreads();  // the next tile reuses storage
    }

    // 4. Every element gets the output before its thread's chunk.
    const Acc carry = prefix(total);
    const Acc before_chunk = apply<Compensated, Acc, Resets>(exclusive, carry);
    if (item_resets) {
      #pragma unroll
      for (int i = 0; i < Items; ++i) value[i] = advance(coeff[i], before_chunk, value[i]);
    } else {
      #pragma unroll
      for (int i = 0; i < Items; ++i) value[i] = coeff[i] * before_chunk + value[i];
    }
  }
};

}  // namespace linrec
