// Moving a tile between global memory and registers. A segment of ThreadsPerSequence threads owns a
// tile; each thread holds Items consecutive elements of it in registers. The strategies:
//   Vectorized: each thread reads and writes its own chunk with 16-byte accesses; needs 16-byte
//               aligned rows. Neighbouring threads' chunks are adjacent, so a warp's accesses are
//               contiguous.
//   Staged:     the segment reads the tile element-interleaved (thread r takes r, r + ThreadsPerSequence,
//               ...), coalesced for any alignment, and shared memory regroups the elements into
//               per-thread chunks (and back for stores).
//   Coalesced:  as Vectorized, but a warp's lanes take neighbouring 16-byte vectors, so that each
//               access instruction of a warp covers 512 contiguous bytes (Vectorized's spread over
//               a thread's chunk fetch every 32-byte sector twice); shared memory regroups the
//               vectors into per-thread chunks (and back for stores). For tiles of whole blocks,
//               which load once and wait with no prefetch to hide the doubled sector traffic
//               behind (chained rows of 4-byte and wider types; figures in docs/design.md, Memory
//               access).
//   Strided:    time is not the contiguous dim (channels are): each thread reads and writes its own
//               chunk element by element through the time stride; the segment's threads sit in
//               different warps, and a warp's lanes take neighbouring channels, so each access of a
//               warp is contiguous across channels.
#pragma once

#include <cstdint>

namespace linrec {

enum class Access : int8_t { Vectorized, Staged, Strided, Coalesced };

// The time stride of a contiguous row, known at compile time (std::integral_constant's conversion
// is host-only).
struct UnitStride {
  __host__ __device__ constexpr operator int64_t() const { return 1; }
};

inline const char* access_name(Access access) {
  switch (access) {
    case Access::Vectorized: return "vectorized";
    case Access::Staged: return "staged";
    case Access::Strided: return "strided";
    case Access::Coalesced: return "coalesced";
  }
  return "unknown";
}

template <typename T, int ThreadsPerSequence, int BlockThreads, int Items, Access Mode>
struct TileIO {
  static constexpr int kTile = ThreadsPerSequence * Items;
  // One bank's worth of padding after every 128 bytes keeps the per-thread chunk reads conflict-free.
  static constexpr int kRowElements = 128 / sizeof(T);
  static constexpr int kPadElements = sizeof(T) < 4 ? 4 / sizeof(T) : 1;
  __host__ __device__ static constexpr int padded(int index) { return index + index / kRowElements * kPadElements; }

  // Coalesced: a segment's tile as 16-byte vectors, vector g at swizzled(g), so that both the warp's
  // neighbouring vectors and the threads' chunks (kChunkVectors apart) fall in distinct banks.
  static constexpr int kPerVector = 16 / sizeof(T);
  static constexpr int kChunkVectors = Items * sizeof(T) / 16;
  static constexpr int kVectorStride = ThreadsPerSequence * kPerVector;  // elements between a thread's vectors
  __device__ __forceinline__ static int swizzled(int vector) { return vector ^ ((vector >> 3) & 7); }

  struct Storage {
    T staged[Mode == Access::Staged ? padded(BlockThreads * Items) : 1];
    uint4 vectors[Mode == Access::Coalesced ? BlockThreads * kChunkVectors : 1];
  };

  Storage& storage;
  const int rank;          // the thread's index within its segment
  const int segment_base;  // the segment's first element in storage

  __device__ __forceinline__ TileIO(Storage& storage_, int rank_, int segment)
      : storage(storage_), rank(rank_), segment_base(segment * kTile) {}

  // The segment's threads exchange data through shared memory: a warp barrier suffices when the
  // segment lies within one warp.
  __device__ __forceinline__ static void sync() {
    if constexpr (ThreadsPerSequence <= 32) __syncwarp();
    else __syncthreads();
  }

  // Loads are split in two so that a kernel can issue the next tile's loads before it works on the
  // current one: fetch() moves global memory into registers in the strategy's order (the thread's
  // chunk for Vectorized and Strided; every ThreadsPerSequence-th element of the tile from rank on for
  // Staged), arrange() then makes it the chunk: items[i] = row[(tile_begin + rank * Items + i) *
  // time_stride], fill past length. time_stride is a runtime value for Strided and for rows broadcast
  // along time (0, in the Staged kernels compiled for broadcast operands); the others pass UnitStride,
  // a compile-time 1, which keeps the loads' offsets immediate (a runtime stride costs the 16-bit
  // staged backward half its speed). Vectorized ignores it: its rows are contiguous.
  template <typename Acc, typename Stride>
  __device__ __forceinline__ void fetch(const T* row, Stride time_stride, int64_t tile_begin, int64_t length,
                                        Acc (&items)[Items], Acc fill) const {
    if constexpr (Mode == Access::Vectorized) {
      constexpr int kPerVector = 16 / sizeof(T);
      static_assert(Items % kPerVector == 0, "vectorized chunks are whole 16-byte vectors");
      const int64_t begin = tile_begin + static_cast<int64_t>(rank) * Items;
      if (begin + Items <= length) {
        #pragma unroll
        for (int v = 0; v < Items / kPerVector; ++v) {
          const uint4 bits = *reinterpret_cast<const uint4*>(row + begin + v * kPerVector);
          const T* values = reinterpret_cast<const T*>(&bits);
          #pragma unroll
          for (int i = 0; i < kPerVector; ++i) items[v * kPerVector + i] = static_cast<Acc>(values[i]);
        }
      } else {
        #pragma unroll
        for (int i = 0; i < Items; ++i) items[i] = begin + i < length ? static_cast<Acc>(row[begin + i]) : fill;
      }
    } else if constexpr (Mode == Access::Coalesced) {
      // items[u * kPerVector + i]: element i of the tile's vector u * ThreadsPerSequence + rank.
      static_assert(Items % kPerVector == 0, "coalesced chunks are whole 16-byte vectors");
      static_assert(ThreadsPerSequence * kChunkVectors % 8 == 0, "the swizzle permutes groups of 8 vectors");
      // One pointer and compile-time offsets: 64-bit indices per vector cost the capped forward spills.
      const T* first = row + tile_begin + rank * kPerVector;
      if (tile_begin + kTile <= length) {
        #pragma unroll
        for (int u = 0; u < kChunkVectors; ++u) unpack(*reinterpret_cast<const uint4*>(first + u * kVectorStride), items, u);
      } else {
        const int64_t left = length - tile_begin - rank * kPerVector;  // elements from `first` to the row's end
        #pragma unroll
        for (int u = 0; u < kChunkVectors; ++u) {
          #pragma unroll
          for (int i = 0; i < kPerVector; ++i) {
            const int offset = u * kVectorStride + i;
            items[u * kPerVector + i] = offset < left ? static_cast<Acc>(first[offset]) : fill;
          }
        }
      }
    } else if constexpr (Mode == Access::Staged) {
      #pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int64_t index = tile_begin + rank + k * ThreadsPerSequence;
        items[k] = index < length ? static_cast<Acc>(row[index * time_stride]) : fill;
      }
    } else {
      const int64_t begin = tile_begin + static_cast<int64_t>(rank) * Items;
      const T* chunk = row + begin * time_stride;
      if (begin + Items <= length) {
        #pragma unroll
        for (int i = 0; i < Items; ++i) items[i] = static_cast<Acc>(chunk[i * time_stride]);
      } else {
        #pragma unroll
        for (int i = 0; i < Items; ++i) items[i] = begin + i < length ? static_cast<Acc>(chunk[i * time_stride]) : fill;
      }
    }
  }

  template <typename Acc>
  __device__ __forceinline__ void arrange(Acc (&items)[Items]) const {
    if constexpr (Mode == Access::Coalesced) {
      #pragma unroll
      for (int u = 0; u < kChunkVectors; ++u) storage.vectors[vector_slot(u * ThreadsPerSequence + rank)] = pack(items, u);
      sync();
      #pragma unroll
      for (int v = 0; v < kChunkVectors; ++v) unpack(storage.vectors[vector_slot(rank * kChunkVectors + v)], items, v);
      sync();  // the next arrange or store reuses the buffer
    } else if constexpr (Mode == Access::Staged) {
      // The values went T -> Acc on fetch; Acc -> T here is exact.
      #pragma unroll
      for (int k = 0; k < Items; ++k) storage.staged[padded(segment_base + rank + k * ThreadsPerSequence)] = static_cast<T>(items[k]);
      sync();
      #pragma unroll
      for (int i = 0; i < Items; ++i) items[i] = static_cast<Acc>(storage.staged[padded(segment_base + rank * Items + i)]);
      sync();  // the next arrange or store reuses the buffer
    }
  }

  // row[(tile_begin + rank * Items + i) * time_stride] = items[i] where inside length; time_stride is
  // UnitStride except for Strided.
  template <typename Acc, typename Stride>
  __device__ __forceinline__ void store(T* row, Stride time_stride, int64_t tile_begin, int64_t length,
                                        const Acc (&items)[Items]) const {
    if constexpr (Mode == Access::Vectorized) {
      constexpr int kPerVector = 16 / sizeof(T);
      const int64_t begin = tile_begin + static_cast<int64_t>(rank) * Items;
      if (begin + Items <= length) {
        #pragma unroll
        for (int v = 0; v < Items / kPerVector; ++v) {
          uint4 bits;
          T* values = reinterpret_cast<T*>(&bits);
          #pragma unroll
          for (int i = 0; i < kPerVector; ++i) values[i] = static_cast<T>(items[v * kPerVector + i]);
          // The intrinsic keeps the store one 16-byte access: written as an assignment, the compiler
          // was seen to split a chunk's first vector into 4-byte stores, which slows the forward
          // (docs/design.md, Memory access).
          __stwb(reinterpret_cast<uint4*>(row + begin + v * kPerVector), bits);
        }
      } else {
        #pragma unroll
        for (int i = 0; i < Items; ++i)
          if (begin + i < length) row[begin + i] = static_cast<T>(items[i]);
      }
    } else if constexpr (Mode == Access::Coalesced) {
      #pragma unroll
      for (int v = 0; v < kChunkVectors; ++v) storage.vectors[vector_slot(rank * kChunkVectors + v)] = pack(items, v);
      sync();
      T* first = row + tile_begin + rank * kPerVector;
      const bool whole = tile_begin + kTile <= length;
      const int64_t left = length - tile_begin - rank * kPerVector;
      #pragma unroll
      for (int u = 0; u < kChunkVectors; ++u) {
        const uint4 bits = storage.vectors[vector_slot(u * ThreadsPerSequence + rank)];
        if (whole) {
          __stwb(reinterpret_cast<uint4*>(first + u * kVectorStride), bits);
        } else {
          const T* values = reinterpret_cast<const T*>(&bits);
          #pragma unroll
          for (int i = 0; i < kPerVector; ++i)
            if (u * kVectorStride + i < left) first[u * kVectorStride + i] = values[i];
        }
      }
      sync();
    } else if constexpr (Mode == Access::Strided) {
      const int64_t begin = tile_begin + static_cast<int64_t>(rank) * Items;
      T* chunk = row + begin * time_stride;
      #pragma unroll
      for (int i = 0; i < Items; ++i)
        if (begin + i < length) chunk[i * time_stride] = static_cast<T>(items[i]);
    } else {
      #pragma unroll
      for (int i = 0; i < Items; ++i)
        storage.staged[padded(segment_base + rank * Items + i)] = static_cast<T>(items[i]);
      sync();
      #pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int index = rank + k * ThreadsPerSequence;
        if (tile_begin + index < length) row[tile_begin + index] = storage.staged[padded(segment_base + index)];
      }
      sync();
    }
  }

 private:
  // Coalesced: the shared-memory slot of the segment's vector `vector`.
  __device__ __forceinline__ int vector_slot(int vector) const {
    return segment_base / kPerVector + swizzled(vector);
  }

  // Vector `v` of items (kPerVector of them from v * kPerVector) as T, and back; Acc -> T is exact
  // for values that came from T. The Vectorized fetch and store convert in place instead: through
  // these, 16-bit rows measured slower (docs/design.md, Memory access).
  template <typename Acc>
  __device__ __forceinline__ static uint4 pack(const Acc (&items)[Items], int v) {
    uint4 bits;
    T* values = reinterpret_cast<T*>(&bits);
    #pragma unroll
    for (int i = 0; i < kPerVector; ++i) values[i] = static_cast<T>(items[v * kPerVector + i]);
    return bits;
  }
  template <typename Acc>
  __device__ __forceinline__ static void unpack(const uint4& bits, Acc (&items)[Items], int v) {
    const T* values = reinterpret_cast<const T*>(&bits);
    #pragma unroll
    for (int i = 0; i < kPerVector; ++i) items[v * kPerVector + i] = static_cast<Acc>(values[i]);
  }
};

// The unsigned type of `Bytes` bytes, for a run's single access.
template <int Bytes> struct RunBits;
template <> struct RunBits<2> { using type = unsigned short; };
template <> struct RunBits<4> { using type = unsigned int; };
template <> struct RunBits<8> { using type = uint2; };
template <> struct RunBits<16> { using type = uint4; };

// A run of N consecutive elements of a contiguous row from `begin`, as stored (zeros at and past
// `length`), in one register-sized value: kept so until unpacked, the load need not complete before
// it is used. With `aligned` (the row starts aligned to the run's size, and begin is a multiple of
// N), a run wholly inside the row is one access of N * sizeof(T) bytes.
template <int N, typename T>
__device__ __forceinline__ typename RunBits<N * sizeof(T)>::type fetch_bits(const T* row, int64_t begin, int64_t length,
                                                                         bool aligned) {
  using Bits = typename RunBits<N * sizeof(T)>::type;
  if (aligned && begin + N <= length) return *reinterpret_cast<const Bits*>(row + begin);
  Bits bits;
  T* values = reinterpret_cast<T*>(&bits);
  #pragma unroll
  for (int i = 0; i < N; ++i) values[i] = begin + i < length ? row[begin + i] : static_cast<T>(0.0f);
  return bits;
}

// The elements of a fetched run, as Acc.
template <int N, typename T, typename Acc, typename Bits>
__device__ __forceinline__ void unpack_run(const Bits& bits, Acc (&items)[N]) {
  static_assert(sizeof(Bits) == N * sizeof(T), "a run's bits hold its N elements");
  const T* values = reinterpret_cast<const T*>(&bits);
  #pragma unroll
  for (int i = 0; i < N; ++i) items[i] = static_cast<Acc>(values[i]);
}

// row[begin + i] = items[i] for the steps before `length`, as fetch_bits reads them.
template <int N, typename T, typename Acc>
__device__ __forceinline__ void store_run(T* row, int64_t begin, int64_t length, bool aligned, const Acc (&items)[N]) {
  using Bits = typename RunBits<N * sizeof(T)>::type;
  if (aligned && begin + N <= length) {
    Bits bits;
    T* values = reinterpret_cast<T*>(&bits);
    #pragma unroll
    for (int i = 0; i < N; ++i) values[i] = static_cast<T>(items[i]);
    *reinterpret_cast<Bits*>(row + begin) = bits;
  } else {
    #pragma unroll
    for (int i = 0; i < N; ++i)
      if (begin + i < length) row[begin + i] = static_cast<T>(items[i]);
  }
}

// One element, or `fill` outside [0, length): the neighbour a shifted (backward) access needs.
template <typename T, typename Acc, typename Stride>
__device__ __forceinline__ Acc load_one(const T* row, Stride time_stride, int64_t index, int64_t length, Acc fill) {
  return index >= 0 && index < length ? static_cast<Acc>(row[index * time_stride]) : fill;
}

}  // namespace linrec
