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
// A chained group has at most 32 sequences (a bit each in the rescan counters).
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
  __host__ __device__ int64_t statuses_bytes() const {
    if constexpr (kPackedStatus<Acc>) return num_slots() * static_cast<int64_t>(sizeof(PackedStatus));
    else return flags_bytes() + aggregates_bytes() + num_slots() * static_cast<int64_t>(sizeof(Acc));
  }
  // After the statuses, two counters per group for the rescan of non-finite results
  // (nonfinite_rescan.h): the chunks done, and a bit per sequence whose results hold a non-finite value.
  __host__ __device__ int64_t bytes() const {
    return aligned(statuses_bytes()) + num_groups * 2 * static_cast<int64_t>(sizeof(int));
  }
  __host__ __device__ int* rescan_counters(void* workspace, int64_t group) const {
    return reinterpret_cast<int*>(static_cast<char*>(workspace) + aligned(statuses_bytes())) + 2 * group;
  }
};

// The prefix hook (TileScan::scan) of a chained scan. Every thread of the block calls it with its
// sequence's tile total. The look-back is run by the first LookBackThreads threads of the block: a
// WindowScan (a TileScan in chunk order) has each of a sequence's threads poll WindowItems
// consecutive chunks and composes their maps in one scan, so a window of `window` chunks costs one
// round trip to L2. An inclusive chunk's map is constant (coefficient 0) and annihilates the maps
// before it; a sequence is done once its composed map is constant, at the latest at its first chunk.
// A map made constant by products that underflow drops an earlier non-finite state, as a composition
// with coefficient 0 does (numeric.h): such a sequence holds a non-finite result at the state's own
// step, and is rescanned (nonfinite_rescan.h). The composition's order depends on which chunks had
// published their inclusive output when a block looked, so its last bits may vary from run to run.
// One sequence a block (time-contiguous rows) looks back with its first warp, 32 chunks a step: the
// chunk before is rarely further, and the whole block's registers and barriers measured slower
// (docs/design.md, Chained look-back). Strided time looks back with the whole block, 32 chunks of
// each of 32 channels a step.
template <typename Acc, int Sequences, typename WindowScan, int WindowItems, int LookBackThreads>
struct ChainedPrefix {
  static constexpr bool kPacked = kPackedStatus<Acc>;
  static constexpr bool kWarpOnly = LookBackThreads == 32;
  static_assert(!kWarpOnly || Sequences == 1, "a look-back by one warp serves one sequence");

  struct Storage {
    typename WindowScan::template Storage<Acc> window;
    Acc carry;  // kWarpOnly: the first warp's result, for the rest of the block
  };

  Storage& storage;
  void* const workspace;
  const ChainLayout<Acc, Sequences> layout;
  const int64_t group, chunk;
  const int sequence;  // the thread's sequence within the group
  const int rank;      // the thread's rank among its sequence's look-back threads
  const int window;    // chunks a look-back step covers
  const bool valid;    // whether the thread's sequence exists (the last group may be short)

  __device__ __forceinline__ int64_t slot(int64_t chunk_index) const {
    return (group * layout.num_chunks + chunk_index) * Sequences + sequence;
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
    const bool publishes = rank == 0 && valid;  // one thread per sequence
    Acc carry = Acc(0);                          // the first chunk starts the sequence
    if (chunk > 0) {
      publish(publishes, kChunkAggregate, tile_total.coeff, tile_total.value);
      if constexpr (kWarpOnly) {
        if (threadIdx.x < LookBackThreads) {
          const Acc warp_carry = look_back();
          if (threadIdx.x == 0) storage.carry = warp_carry;
        }
        __syncthreads();
        carry = storage.carry;
      } else {
        carry = look_back();
      }
    }
    publish(publishes, kChunkInclusive, Acc(0), advance(tile_total.coeff, carry, tile_total.value));
    return carry;
  }

  // Makes this chunk's aggregate or inclusive output visible to later chunks.
  __device__ __forceinline__ void publish(bool publishes, int state, const Acc& coeff, const Acc& value) const {
    if constexpr (kPacked) {
      if (publishes) store_status(statuses() + slot(chunk), state, coeff, value);
    } else {
      if (publishes) {
        if (state == kChunkInclusive) inclusive()[slot(chunk)] = value;
        else aggregates()[slot(chunk)] = {coeff, value};
      }
      __syncthreads();  // every sequence's values, then one release of the group's flag
      if (threadIdx.x == 0) store_release(flag(chunk), state);
    }
  }

  // The output before this chunk: the composition of the maps of the chunks before it, window after
  // window towards the start, until it is constant. Called by the look-back threads.
  __device__ __forceinline__ Acc look_back() const {
    Affine<Acc> later{Acc(1), Acc(0)};  // the chunks composed so far, up to this one
    bool done = !valid;
    for (int64_t end = chunk;; end -= window) {
      Acc coeff[WindowItems], value[WindowItems];
      bool polls[WindowItems];
      #pragma unroll
      for (int i = 0; i < WindowItems; ++i) {
        const int64_t polled = end - window + static_cast<int64_t>(rank) * WindowItems + i;
        polls[i] = !done && polled >= 0;
        coeff[i] = Acc(1), value[i] = Acc(0);  // the identity, for chunks before the first
      }
      poll(end - window + static_cast<int64_t>(rank) * WindowItems, polls, coeff, value);
      Affine<Acc> window_map{Acc(1), Acc(0)};
      const auto take_total = [&window_map](const Affine<Acc>& total) {
        window_map = total;
        return Acc(0);
      };
      WindowScan::scan(value, coeff, storage.window, take_total);
      if (!done) {
        later = then(window_map, later);
        done = is_zero(later.coeff) || end - window <= 0;
      }
      if constexpr (kWarpOnly) {
        if (done) break;  // uniform: the warp serves one sequence
      } else {
        if (!__syncthreads_or(!done)) break;
      }
    }
    return later.value;  // a constant map: later.coeff is 0
  }

  // One read of chunk `k`'s status: false while it is pending, else true with its map (the
  // aggregate, or the constant map to the inclusive output).
  __device__ __forceinline__ bool try_read(int64_t k, Acc& coeff, Acc& value) const {
    if constexpr (kPacked) {
      const PackedStatus status = load_status(statuses() + slot(k));
      coeff = status.state == kChunkInclusive ? 0.0f : status.coeff;
      value = status.value;
      return status.state != kChunkPending;
    } else {
      const int state = load_acquire(flag(k));
      if (state == kChunkInclusive) {
        coeff = Acc(0);
        value = load_published(inclusive() + slot(k));
      } else if (state == kChunkAggregate) {
        coeff = load_published(&aggregates()[slot(k)].coeff);
        value = load_published(&aggregates()[slot(k)].value);
      }
      return state != kChunkPending;
    }
  }

  // Reads the maps of chunks first .. first + WindowItems - 1 of the thread's sequence (those `polls`
  // marks; the others keep the identity), waiting for those still pending: all are read at once, and
  // the pending ones again, together, round after round (a round trip to L2 a round). A look-back by
  // one warp (a chunk a lane) waits only for the chunks after the last constant map it has read: the
  // ones before are annihilated by it, and their blocks may still be loading (with coefficients in
  // [0, 1) a 4096-element chunk's map is constant in float32, and the chunk before is all it needs).
  __device__ __forceinline__ void poll(int64_t first, const bool (&polls)[WindowItems], Acc (&coeff)[WindowItems],
                                       Acc (&value)[WindowItems]) const {
    static_assert(!kWarpOnly || WindowItems == 1, "a look-back by one warp reads a chunk a lane");
    bool pending[WindowItems];
    #pragma unroll
    for (int i = 0; i < WindowItems; ++i) pending[i] = polls[i] && !try_read(first + i, coeff[i], value[i]);
    for (;;) {
      bool waits = false;
      if constexpr (kWarpOnly) {
        const unsigned constant = __ballot_sync(0xffffffffu, polls[0] && !pending[0] && is_zero(coeff[0]));
        if (static_cast<uint64_t>(constant) >> (rank + 1) != 0) {  // a later chunk's map is constant
          pending[0] = false;
          coeff[0] = Acc(1), value[0] = Acc(0);
        }
        waits = __any_sync(0xffffffffu, pending[0]);
      } else {
        #pragma unroll
        for (int i = 0; i < WindowItems; ++i) waits = waits || pending[i];
      }
      if (!waits) break;
      __nanosleep(32);
      #pragma unroll
      for (int i = 0; i < WindowItems; ++i)
        if (pending[i]) pending[i] = !try_read(first + i, coeff[i], value[i]);
    }
  }
};

}  // namespace linrec
