// Moving a thread's items between global memory and registers. Each thread owns Items consecutive
// elements; neighbouring threads own neighbouring chunks, so a warp's accesses are contiguous.
#pragma once

#include <cstdint>

namespace linrec::memio {

// 16-byte accesses when the chunk lies fully inside the sequence and Vectorized says the pointers
// and row length allow them; element by element otherwise, `fill` standing in past the end.
template <bool Vectorized, int Items, typename T, typename Acc>
__device__ __forceinline__ void load_chunk(const T* row, int64_t begin, int64_t length, Acc (&items)[Items], Acc fill) {
  constexpr int kPerVector = 16 / sizeof(T);
  if constexpr (Vectorized && Items % kPerVector == 0) {
    if (begin + Items <= length) {
      #pragma unroll
      for (int v = 0; v < Items / kPerVector; ++v) {
        const uint4 bits = *reinterpret_cast<const uint4*>(row + begin + v * kPerVector);
        const T* values = reinterpret_cast<const T*>(&bits);
        #pragma unroll
        for (int i = 0; i < kPerVector; ++i) items[v * kPerVector + i] = static_cast<Acc>(values[i]);
      }
      return;
    }
  }
  #pragma unroll
  for (int i = 0; i < Items; ++i) items[i] = begin + i < length ? static_cast<Acc>(row[begin + i]) : fill;
}

template <bool Vectorized, int Items, typename T, typename Acc>
__device__ __forceinline__ void store_chunk(T* row, int64_t begin, int64_t length, const Acc (&items)[Items]) {
  constexpr int kPerVector = 16 / sizeof(T);
  if constexpr (Vectorized && Items % kPerVector == 0) {
    if (begin + Items <= length) {
      #pragma unroll
      for (int v = 0; v < Items / kPerVector; ++v) {
        uint4 bits;
        T* values = reinterpret_cast<T*>(&bits);
        #pragma unroll
        for (int i = 0; i < kPerVector; ++i) values[i] = static_cast<T>(items[v * kPerVector + i]);
        *reinterpret_cast<uint4*>(row + begin + v * kPerVector) = bits;
      }
      return;
    }
  }
  #pragma unroll
  for (int i = 0; i < Items; ++i)
    if (begin + i < length) row[begin + i] = static_cast<T>(items[i]);
}

// One element, or `fill` outside [0, length): the neighbour a shifted (backward) access needs.
template <typename T, typename Acc>
__device__ __forceinline__ Acc load_one(const T* row, int64_t index, int64_t length, Acc fill) {
  return index >= 0 && index < length ? static_cast<Acc>(row[index]) : fill;
}

}  // namespace linrec::memio
