// Chained scans: sequences too few to fill the GPU are split into chunks (one tile each) scanned by
// different blocks in a single pass. A block scans its tile, publishes the tile's map (aggregate),
// looks back at the maps before it for the output before its chunk, and only then stores, so every
// element is read and written once, as in the pipe.
//
// A block's chunk covers Sequences sequences at once (1 for time-contiguous rows, the 32 channels of
// a warp for strided time). Chunk c of group g is block c * num_groups + g: a block waits only for
// blocks of lower index, which the hardware starts first (CUB's single-pass scan relies on the same
// order), so the chunks running at once are the same few of every group.
//
// The look-back composes in a fixed order, so that results are the same bits from run to run, and in
// a few round trips to L2 whatever the number of chunks. The maps form levels: level 0 holds the
// chunks' maps; item j of level l + 1 is the map of the Window items Window * j .. Window * j + 1 of
// level l, published by its last chunk. The output before chunk k composes, level by level from the
// bottom, the items before k's own among its siblings (those with the same parent), each level's in one
// WindowScan (a TileScan in item order). A look-back that stops at the first inclusive output it finds
// (Merrill & Garland 2016) is as short, but associates the products by timing.
//
// A constant map (coefficient 0: a sequence start, or products underflowed to 0) annihilates the maps
// before it bitwise (numeric.h): a look-back whose composition is constant stops climbing, and a look-back
// by one warp stops waiting for the items before a constant one. With coefficients in [0, 1) a
// 4096-element chunk's map is constant in float32, and the chunk before is all a block waits for. A
// constant map drops an earlier non-finite state: the sequence then holds a non-finite result at the
// state's own step, and is rescanned (nonfinite_rescan.h).
//
// An item's status for one sequence is its map with a state (pending or published). Float
// accumulators keep both in one 16-byte word, written and read with single 16-byte accesses: a reader
// sees a state and its values together, with one round trip and no fences. Wider accumulators keep a
// flag per item apart from the values, ordered by release and acquire.
#pragma once

#include <cstdint>
#include <type_traits>

#include "linrec/block_scan.h"
#include "linrec/params.h"

namespace linrec {

enum ItemState : int { kItemPending = 0, kItemPublished = 1 };

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

// One sequence's item in one 16-byte word (float accumulators).
struct alignas(16) PackedStatus {
  int state;
  float coeff, value, error;
};

__device__ __forceinline__ PackedStatus load_status(const PackedStatus* address) {
  const int4 bits = __ldcg(reinterpret_cast<const int4*>(address));
  return {bits.x, __int_as_float(bits.y), __int_as_float(bits.z), __int_as_float(bits.w)};
}

__device__ __forceinline__ void store_status(PackedStatus* address, const Affine<float>& map) {
  __stcg(reinterpret_cast<int4*>(address), make_int4(kItemPublished, __float_as_int(map.coeff),
                                                     __float_as_int(map.value), __float_as_int(map.error)));
}

template <typename Acc>
constexpr bool kPackedStatus = std::is_same_v<Acc, float>;

// Where the items' statuses live in the workspace (zeroed before the launch: every item pending).
// A group's items are its levels one after the other: num_chunks chunks, then their parents, up to the
// first level of at most Window items (whose parent no chunk reads). A chained group has at most 32
// sequences (a bit each in the rescan flags). Packed: a PackedStatus per (group, item, sequence).
// Otherwise: a flag per (group, item), then the map per (group, item, sequence).
template <typename Acc, int Sequences, int Window>
struct ChainLayout {
  static constexpr int64_t kAlignment = 16;

  int64_t num_groups, num_chunks;

  __host__ __device__ static constexpr int64_t aligned(int64_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  __host__ __device__ int64_t num_blocks() const { return num_groups * num_chunks; }
  // The first item of `level` within a group.
  __host__ __device__ int64_t level_offset(int level) const {
    int64_t offset = 0;
    for (int64_t items = num_chunks; level > 0; --level, items = (items + Window - 1) / Window) offset += items;
    return offset;
  }
  __host__ __device__ int64_t items_per_group() const {
    int64_t total = num_chunks;
    for (int64_t items = num_chunks; items > Window;) {
      items = (items + Window - 1) / Window;
      total += items;
    }
    return total;
  }
  __host__ __device__ int64_t num_entries() const { return num_groups * items_per_group(); }
  __host__ __device__ int64_t num_slots() const { return num_entries() * Sequences; }
  __host__ __device__ int64_t flags_bytes() const { return aligned(num_entries() * static_cast<int64_t>(sizeof(int))); }
  __host__ __device__ int64_t statuses_bytes() const {
    if constexpr (kPackedStatus<Acc>) return num_slots() * static_cast<int64_t>(sizeof(PackedStatus));
    else return flags_bytes() + num_slots() * static_cast<int64_t>(sizeof(Affine<Acc>));
  }
  // After the statuses, a word per group for the rescan of non-finite results (nonfinite_rescan.h): a
  // bit per sequence whose results hold a non-finite value.
  __host__ __device__ int64_t bytes() const {
    return aligned(statuses_bytes()) + num_groups * static_cast<int64_t>(sizeof(int));
  }
  __host__ __device__ int* rescan_flags(void* workspace, int64_t group) const {
    return reinterpret_cast<int*>(static_cast<char*>(workspace) + aligned(statuses_bytes())) + group;
  }
};

// The prefix hook (TileScan::scan) of a chained scan. Every thread of the block calls it with its
// sequence's tile total. The look-back is run by the first LookBackThreads threads of the block, each
// of a sequence's threads holding WindowItems consecutive items of a level: one sequence a block
// (time-contiguous rows) looks back with its first warp, an item a lane (the whole block would add its
// barriers to the look-back's latency: docs/design.md, Chained look-back); strided time with the whole block,
// 4 items a thread of each of 32 channels.
template <typename Acc, int Sequences, typename WindowScan, int WindowItems, int LookBackThreads>
struct ChainedPrefix {
  static constexpr bool kPacked = kPackedStatus<Acc>;
  static constexpr bool kWarpOnly = LookBackThreads == 32;
  static_assert(!kWarpOnly || Sequences == 1, "a look-back by one warp serves one sequence");
  static constexpr int kWindow = LookBackThreads / Sequences * WindowItems;  // items a level's look-back covers
  static constexpr bool kCompensated = WindowScan::kCompensated;
  static_assert((kWindow & (kWindow - 1)) == 0, "levels are indexed by shifts");
  static constexpr int kWindowBits = __builtin_ctz(kWindow);
  using Layout = ChainLayout<Acc, Sequences, kWindow>;

  struct Storage {
    typename WindowScan::template Storage<Acc> window;
    Acc carry;  // kWarpOnly: the first warp's result, for the rest of the block
  };

  Storage& storage;
  void* const workspace;
  const Layout layout;
  const int64_t group, chunk;
  const int sequence;  // the thread's sequence within the group
  const int rank;      // the thread's rank among its sequence's look-back threads
  const bool valid;    // whether the thread's sequence exists (the last group may be short)

  __device__ __forceinline__ int64_t entry(int level, int64_t item) const {
    return group * layout.items_per_group() + layout.level_offset(level) + item;
  }
  __device__ __forceinline__ int* flag(int64_t entry_index) const { return static_cast<int*>(workspace) + entry_index; }
  __device__ __forceinline__ PackedStatus* status(int64_t entry_index) const {
    return static_cast<PackedStatus*>(workspace) + entry_index * Sequences + sequence;
  }
  __device__ __forceinline__ Affine<Acc>* map(int64_t entry_index) const {
    return reinterpret_cast<Affine<Acc>*>(static_cast<char*>(workspace) + layout.flags_bytes()) +
           entry_index * Sequences + sequence;
  }

  __device__ __forceinline__ Acc operator()(const Affine<Acc>& tile_total) {
    const bool publishes = rank == 0 && valid;  // one thread per sequence
    publish(publishes, entry(0, chunk), tile_total);
    if constexpr (kWarpOnly) {
      if (threadIdx.x < LookBackThreads) {
        const Acc warp_carry = look_back(tile_total, publishes);
        if (threadIdx.x == 0) storage.carry = warp_carry;
      }
      __syncthreads();
      return storage.carry;
    } else {
      return look_back(tile_total, publishes);
    }
  }

  // Makes an item's map visible to later chunks. A block-wide flag waits for every sequence's map; a
  // look-back by one warp has one sequence, whose thread releases its own map.
  __device__ __forceinline__ void publish(bool publishes, int64_t entry_index, const Affine<Acc>& item) const {
    if constexpr (kPacked) {
      if (publishes) store_status(status(entry_index), item);
    } else if constexpr (kWarpOnly) {
      if (publishes) {
        *map(entry_index) = item;
        store_release(flag(entry_index), kItemPublished);
      }
    } else {
      if (publishes) *map(entry_index) = item;
      __syncthreads();
      if (threadIdx.x == 0) store_release(flag(entry_index), kItemPublished);
    }
  }

  // Whether any look-back thread's `condition` holds: the decisions that lead to a WindowScan (which
  // synchronizes the block) or a block-wide publish are the whole block's.
  __device__ __forceinline__ static bool any(bool condition) {
    if constexpr (kWarpOnly) return __any_sync(0xffffffffu, condition);
    else return __syncthreads_or(condition);
  }

  // The output before this chunk; on the way, the maps of the groups this chunk is the last of.
  // Called by the look-back threads.
  __device__ __forceinline__ Acc look_back(const Affine<Acc>& tile_total, bool publishes) const {
    Affine<Acc> before = identity_map<Acc>();  // the items composed so far, up to this chunk
    Affine<Acc> own = tile_total;              // the map of this chunk's group at `level`, if it ends it
    for (int level = 0;; ++level) {
      const int shift = level * kWindowBits;            // a `level` item covers 2^shift chunks
      const int64_t index = chunk >> shift;             // this chunk's item at `level`
      const int64_t first = index >> kWindowBits << kWindowBits;  // its first sibling
      // The parent's map is this chunk's to publish where it ends the parent, and a later chunk reads it.
      const int64_t parent_chunks = int64_t(1) << (shift + kWindowBits);
      const bool ends_parent = ((chunk + 1) & (parent_chunks - 1)) == 0 && chunk + 1 < layout.num_chunks;
      const bool wants_before = valid && index > 0 && !is_zero(before.coeff);
      const bool wants_parent = valid && ends_parent && !is_zero(own.coeff);
      if (!any(wants_before || ends_parent)) break;
      Affine<Acc> siblings = identity_map<Acc>();
      if (any(wants_before || wants_parent)) siblings = compose(level, first, index, wants_before || wants_parent);
      if (wants_before) before = then<kCompensated>(siblings, before);
      if (ends_parent) {
        if (wants_parent) own = then<kCompensated>(siblings, own);
        publish(publishes, entry(level + 1, index >> kWindowBits), own);
      }
    }
    return before.value;  // the state before the sequence is 0
  }

  // The composition of items [first, end) of `level` (end - first < kWindow), by all look-back threads
  // (`reads`: whether this thread's sequence needs them; else it composes the identity).
  __device__ __forceinline__ Affine<Acc> compose(int level, int64_t first, int64_t end, bool reads) const {
    const int64_t mine = first + static_cast<int64_t>(rank) * WindowItems;  // this thread's first item
    const int64_t base = entry(level, 0);
    Affine<Acc> maps[WindowItems];
    bool polls[WindowItems];
    #pragma unroll
    for (int i = 0; i < WindowItems; ++i) {
      polls[i] = reads && mine + i < end;
      maps[i] = identity_map<Acc>();
    }
    poll(base + mine, polls, maps);
    Acc coeff[WindowItems], value[WindowItems], error[WindowItems];
    #pragma unroll
    for (int i = 0; i < WindowItems; ++i) coeff[i] = maps[i].coeff, value[i] = maps[i].value, error[i] = maps[i].error;
    Affine<Acc> composed;
    const auto take_total = [&composed](const Affine<Acc>& total) {
      composed = total;
      return Acc(0);
    };
    WindowScan::template scan<true>(value, coeff, error, storage.window, take_total);
    return composed;
  }

  // One read of an item's status: false while it is pending, else true with its map.
  __device__ __forceinline__ bool try_read(int64_t entry_index, Affine<Acc>& item) const {
    if constexpr (kPacked) {
      const PackedStatus word = load_status(status(entry_index));
      item = {word.coeff, word.value, word.error};
      return word.state != kItemPending;
    } else {
      if (load_acquire(flag(entry_index)) == kItemPending) return false;
      const Affine<Acc>& published = *map(entry_index);
      item = {load_published(&published.coeff), load_published(&published.value),
              kCompensated ? load_published(&published.error) : Acc(0)};
      return true;
    }
  }

  // Reads the maps of entries first .. first + WindowItems - 1 of the thread's sequence (those `polls`
  // marks; the others keep the identity), waiting for those still pending: all are read at once, and
  // the pending ones again, together, round after round (a round trip to L2 a round). A look-back by
  // one warp (an item a lane) waits only for the items after the last constant map it has read: the
  // ones before are annihilated by it, and their blocks may still be loading.
  __device__ __forceinline__ void poll(int64_t first, const bool (&polls)[WindowItems],
                                       Affine<Acc> (&maps)[WindowItems]) const {
    static_assert(!kWarpOnly || WindowItems == 1, "a look-back by one warp reads an item a lane");
    bool pending[WindowItems];
    #pragma unroll
    for (int i = 0; i < WindowItems; ++i) pending[i] = polls[i] && !try_read(first + i, maps[i]);
    for (;;) {
      bool waits = false;
      if constexpr (kWarpOnly) {
        const unsigned constant = __ballot_sync(0xffffffffu, polls[0] && !pending[0] && is_zero(maps[0].coeff));
        if (static_cast<uint64_t>(constant) >> (rank + 1) != 0) {  // a later item's map is constant
          pending[0] = false;
          maps[0] = identity_map<Acc>();
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
        if (pending[i]) pending[i] = !try_read(first + i, maps[i]);
    }
  }
};

}  // namespace linrec
