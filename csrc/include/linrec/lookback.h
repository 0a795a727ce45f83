// Chained scans: sequences too few to fill the GPU are split into chunks (one tile each) scanned by
// different blocks in a single pass. A block scans its tile, publishes the tile's map (aggregate),
// looks back at the chunks before it until one has published its inclusive output (decoupled
// look-back, Merrill & Garland 2016), publishes its own inclusive output and only then stores, so
// every element is read and written once, as in the pipe.
//
// A block's chunk covers Sequences sequences at once (1 for time-contiguous rows, the 32 channels of
// a warp for strided time). Chunk c of group g is block c * num_groups + g: a block waits only for
// blocks of lower index, which the hardware starts first (CUB's single-pass scan relies on the same
// order), so the chunks running at once are the same few of every group.
//
// A chunk's status for one sequence is a state and a map. Float accumulators (float32 and the 16-bit
// types) keep both in one 16-byte word, written and read with single 16-byte accesses: a reader sees
// a state and its values together, with one round trip and no fences. Wider accumulators keep a flag
// per chunk apart from the values, ordered by release and acquire.
#pragma once

#include <cstdint>
#include <type_traits>

#include "linrec/block_scan.h"
#include "linrec/params.h"

namespace linrec {

enum ChunkState : int { kChunkPending = 0, kChunkAggregate = 1, kChunkInclusive = 2 };

__device__ __forceinline__ int load_acquire(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ void store_release(int* flag, int value) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

// A value another block published, read from L2 (the coherence point) rather than a stale L1 line.
template <typename Acc>
__device__ __forceinline__ Acc load_published(const Acc* address) {
  if constexpr (is_complex<Acc>::value) return Acc(__ldcg(&address->re), __ldcg(&address->im));
  else return __ldcg(address);
}

// The status of one sequence's chunk in one 16-byte word (float accumulators).
struct alignas(16) PackedStatus {
  int state;
  float coeff, value;  // the aggregate map; for an inclusive state, value is the inclusive output
  int unused;
};

__device__ __forceinline__ PackedStatus load_status(const PackedStatus* address) {
  const int4 bits = __ldcg(reinterpret_cast<const int4*>(address));
  return {bits.x, __int_as_float(bits.y), __int_as_float(bits.z), 0};
}

__device__ __forceinline__ void store_status(PackedStatus* address, int state, float coeff, float value) {
  __stcg(reinterpret_cast<int4*>(address), make_int4(state, __float_as_int(coeff), __float_as_int(value), 0));
}

template <typename Acc>
constexpr bool kPackedStatus = std::is_same_v<Acc, float>;

// Where the chunks' statuses live in the workspace (zeroed before the launch: every chunk pending).
// Packed: a PackedStatus per (group, chunk, sequence). Otherwise: a flag per (group, chunk), then per
// (group, chunk, sequence) the aggregate map, then the inclusive output.
template <typename Acc, int Sequences>
struct ChainLayout {
  static constexpr int64_t kAlignment = 16;

  int64_t num_groups, num_chunks;

  __host__ __device__ static constexpr int64_t aligned(int64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  __host__ __device__ int64_t num_entries() const { return num_groups * num_chunks; }
  __host__ __device__ int64_t num_slots() const { return num_entries() * Sequences; }
  __host__ __device__ int64_t flags_bytes() const { return aligned(num_entries() * static_cast<int64_t>(sizeof(int))); }
  __host__ __device__ int64_t aggregates_bytes() const {
    return aligned(num_slots() * static_cast<int64_t>(sizeof(Affine<Acc>)));
  }
  __host__ __device__ int64_t bytes() const {
    if constexpr (kPackedStatus<Acc>) return num_slots() * static_cast<int64_t>(sizeof(PackedStatus));
    else return flags_bytes() + aggregates_bytes() + num_slots() * static_cast<int64_t>(sizeof(Acc));
  }
};

// The prefix hook (TileScan::scan) of a chained scan. Every thread of the block calls it with its
// sequence's tile total; `sequence` is the thread's sequence within the group and `leader` marks one
// thread per sequence, in the block's first warp. Only the group's first `valid` sequences exist (the
// last group may be short).
template <typename Acc, int Sequences>
struct ChainedPrefix {
  static constexpr bool kPacked = kPackedStatus<Acc>;
  static constexpr int kWarp = 32;
  static_assert(Sequences == 1 || Sequences == kWarp, "a chunk covers one sequence or a warp's lanes");

  struct Storage {
    Acc carry[Sequences];
  };

  Storage& storage;
  void* const workspace;
  const ChainLayout<Acc, Sequences> layout;
  const int64_t group, chunk;
  const int sequence, valid;
  const bool leader;

  __device__ __forceinline__ int64_t slot(int64_t chunk_index, int sequence_index) const {
    return (group * layout.num_chunks + chunk_index) * Sequences + sequence_index;
  }
  __device__ __forceinline__ PackedStatus* statuses() const { return static_cast<PackedStatus*>(workspace); }
  __device__ __forceinline__ int* flag(int64_t chunk_index) const {
    return static_cast<int*>(workspace) + group * layout.num_chunks + chunk_index;
  }
  __device__ __forceinline__ Affine<Acc>* aggregates() const {
    return reinterpret_cast<Affine<Acc>*>(static_cast<char*>(workspace) + layout.flags_bytes());
  }
  __device__ __forceinline__ Acc* inclusive() const {
    return reinterpret_cast<Acc*>(static_cast<char*>(workspace) + layout.flags_bytes() + layout.aggregates_bytes());
  }

  __device__ __forceinline__ Acc operator()(const Affine<Acc>& tile_total) {
    const bool owns_status = leader && sequence < valid;
    Acc carry = Acc(0);  // the first chunk starts the sequence
    if (chunk > 0) {
      if constexpr (kPacked) {
        if (owns_status) store_status(statuses() + slot(chunk, sequence), kChunkAggregate, tile_total.coeff, tile_total.value);
      } else {
        if (owns_status) aggregates()[slot(chunk, sequence)] = tile_total;
        publish_flag(kChunkAggregate);
      }
      if (threadIdx.x < kWarp) look_back();
      __syncthreads();
      carry = storage.carry[sequence];
    }
    const Acc inclusive_output = tile_total.coeff * carry + tile_total.value;
    if constexpr (kPacked) {
      if (owns_status) store_status(statuses() + slot(chunk, sequence), kChunkInclusive, 0.0f, inclusive_output);
    } else {
      if (owns_status) inclusive()[slot(chunk, sequence)] = inclusive_output;
      publish_flag(kChunkInclusive);
    }
    return carry;
  }

  // After every leader's store of this chunk's values: one release of the chunk's flag.
  __device__ __forceinline__ void publish_flag(int state) const {
    __syncthreads();
    if (threadIdx.x == 0) store_release(flag(chunk), state);
  }

  // The map of a chunk: its aggregate, or, from an inclusive output, the constant map to it.
  __device__ __forceinline__ static Affine<Acc> map_of(int state, const Acc& coeff, const Acc& value) {
    return {state == kChunkInclusive ? Acc(0) : coeff, value};
  }

  // Run by the block's first warp; leaves the output before this chunk of each sequence in storage.
  __device__ __forceinline__ void look_back() const {
    const int lane = threadIdx.x;
    if constexpr (Sequences == 1) {
      // Lanes poll a window of the 32 chunks before `end`; the warp composes the maps from the latest
      // inclusive one in the window (or the window's start) in one scan, window after window towards
      // the sequence's start. The first chunk of a sequence is inclusive straight away: it ends there.
      Affine<Acc> later{Acc(1), Acc(0)};  // the chunks composed so far, up to this one
      for (int64_t end = chunk;;) {
        const int64_t start = end > kWarp ? end - kWarp : 0, polled = start + lane;
        const bool in_window = polled < end;
        int state = kChunkAggregate;
        Acc coeff = Acc(1), value = Acc(0);  // the identity, for lanes outside the window
        if (in_window) poll(polled, 0, state, coeff, value);
        const unsigned inclusive_lanes = __ballot_sync(0xffffffffu, in_window && state == kChunkInclusive);
        const int64_t from = inclusive_lanes ? start + (31 - __clz(inclusive_lanes)) : start;
        Affine<Acc> map{Acc(1), Acc(0)};
        if (in_window && polled >= from) map = map_of(state, coeff, value);
        map = segment_inclusive_scan<kWarp, false>(map);
        const auto from_last_lane = [](auto part) { return __shfl_sync(0xffffffffu, part, kWarp - 1); };
        later = then(Affine<Acc>{shuffled(map.coeff, from_last_lane), shuffled(map.value, from_last_lane)}, later);
        if (inclusive_lanes) break;
        end = start;
      }
      if (lane == 0) storage.carry[0] = later.value;  // starts from an inclusive output: a constant map
    } else if (lane < valid) {
      // A sequence per lane: its chunks' statuses are polled a batch at a time (independent loads in
      // flight), composed from the latest inclusive one in the batch.
      constexpr int kBatch = 8;
      Affine<Acc> later{Acc(1), Acc(0)};
      for (int64_t end = chunk;;) {
        const int64_t start = end > kBatch ? end - kBatch : 0;
        int state[kBatch];
        Acc coeff[kBatch], value[kBatch];
        #pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          state[i] = kChunkAggregate, coeff[i] = Acc(1), value[i] = Acc(0);
          if (start + i < end) poll(start + i, lane, state[i], coeff[i], value[i]);
        }
        Affine<Acc> window{Acc(1), Acc(0)};
        bool found = false;
        #pragma unroll
        for (int i = kBatch - 1; i >= 0; --i) {  // from the latest chunk backwards, up to an inclusive one
          if (!found && start + i < end) {
            window = then(map_of(state[i], coeff[i], value[i]), window);
            found = state[i] == kChunkInclusive;
          }
        }
        later = then(window, later);
        if (found) break;
        end = start;
      }
      storage.carry[lane] = later.value;
    }
  }

  // Waits until chunk `k` of sequence `s` is published and reads its state and map.
  __device__ __forceinline__ void poll(int64_t k, int s, int& state, Acc& coeff, Acc& value) const {
    if constexpr (kPacked) {
      PackedStatus status;
      while ((status = load_status(statuses() + slot(k, s))).state == kChunkPending) __nanosleep(32);
      state = status.state, coeff = status.coeff, value = status.value;
    } else {
      while ((state = load_acquire(flag(k))) == kChunkPending) __nanosleep(32);
      if (state == kChunkInclusive) {
        value = load_published(inclusive() + slot(k, s));
      } else {
        coeff = load_published(&aggregates()[slot(k, s)].coeff);
        value = load_published(&aggregates()[slot(k, s)].value);
      }
    }
  }
};

}  // namespace linrec
