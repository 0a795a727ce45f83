// SIMD vectors of the CPU kernels: the compiler's portable vector extension (GCC and Clang), which
// lowers each operation to whatever the enclosing function's target offers (16-byte SSE2 or NEON,
// 32-byte AVX2, 64-byte AVX-512; isa.h picks the target at run time). Elements are loaded in
// their storage type and converted to the accumulator type (float for the 16-bit types) in vectors.
#pragma once

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// Vectors wider than the baseline target pass through functions that isa.h's flatten attribute
// inlines; GCC still warns that their out-of-line ABI would differ.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace linrec::cpu {

// The integer type of an Acc's width: lane masks and exponent bits.
template <typename Acc>
using LaneBits = std::conditional_t<sizeof(Acc) == 8, int64_t, int32_t>;

// Bytes / sizeof(Acc) lanes of Acc in one vector.
template <typename Acc, int Bytes>
struct Vector {
  static constexpr int kLanes = Bytes / static_cast<int>(sizeof(Acc));
  typedef Acc Values __attribute__((vector_size(Bytes)));
};

// Lanes elements of E in one vector, for the bit-level conversions of the 16-bit types.
template <typename E, int Lanes>
struct LanesOf {
  typedef E type __attribute__((vector_size(Lanes * sizeof(E))));
};

template <typename V>
inline V splat(decltype(V{}[0]) value) {
  return V{} + value;
}

template <typename M>
inline bool any(M mask) {
  for (int i = 0; i < static_cast<int>(sizeof(M) / sizeof(mask[0])); ++i)
    if (mask[i]) return true;
  return false;
}

// Lane `Lane` of v in every lane.
template <int Lane, typename V, std::size_t... I>
inline V broadcast_lane(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (static_cast<int>(I) * 0 + Lane)...);
}
template <int Lane, typename V>
inline V broadcast_lane(V v) {
  return broadcast_lane<Lane>(v, std::make_index_sequence<sizeof(V) / sizeof(v[0])>());
}

// The element type a kernel computes in: float for the 16-bit types, else the stored type.
template <typename T>
using Acc = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;

// Loads `count` elements of T from `source` into lanes [first, first + count) of a vector of Acc; the
// other lanes hold `pad`. Full vectors (first == 0, count == all lanes) are one load and a conversion.
template <typename V, typename T>
inline V load(const T* source, int first, int count, decltype(V{}[0]) pad) {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  constexpr int kLanes = sizeof(V) / sizeof(A);
  if constexpr (std::is_same_v<T, A>) {
    if (count == kLanes) {
      V v;
      std::memcpy(&v, source, sizeof(V));
      return v;
    }
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (count == kLanes) {  // bfloat16 is the upper half of a float
      using Stored = typename LanesOf<uint16_t, kLanes>::type;
      using Widened = typename LanesOf<uint32_t, kLanes>::type;
      Stored stored;
      std::memcpy(&stored, source, sizeof(stored));
      return (V)(__builtin_convertvector(stored, Widened) << 16);
    }
  }
  V v = splat<V>(pad);
  for (int i = 0; i < count; ++i) v[first + i] = static_cast<A>(source[i]);
  return v;
}

template <typename V, typename T>
inline V load(const T* source) {
  return load<V>(source, 0, sizeof(V) / sizeof(V{}[0]), 0);
}

// One element of T in every lane: an operand broadcast along the vector's dim (stride 0).
template <typename V, typename T>
inline V load_splat(const T* source) {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  return splat<V>(static_cast<A>(*source));
}

// Stores lanes [first, first + count) of v, converted to T, to `target`.
template <typename T, typename V>
inline void store(T* target, V v, int first, int count) {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  constexpr int kLanes = sizeof(V) / sizeof(A);
  if constexpr (std::is_same_v<T, A>) {
    if (count == kLanes) {
      std::memcpy(target, &v, sizeof(V));
      return;
    }
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (count == kLanes) {  // rounded to nearest even, NaN to the quiet NaN, as c10::BFloat16 does
      using Bits = typename LanesOf<uint32_t, kLanes>::type;
      using Stored = typename LanesOf<uint16_t, kLanes>::type;
      const Bits bits = (Bits)v;
      const Bits rounded = (bits + ((bits >> 16) & 1) + 0x7FFF) >> 16;
      const Bits nan = (Bits)(v != v);
      const Stored stored = __builtin_convertvector((nan & 0x7FC0) | (~nan & rounded), Stored);
      std::memcpy(target, &stored, sizeof(stored));
      return;
    }
  }
  for (int i = 0; i < count; ++i) target[i] = static_cast<T>(v[first + i]);
}

template <typename T, typename V>
inline void store(T* target, V v) {
  store(target, v, 0, sizeof(V) / sizeof(V{}[0]));
}

// exp in every lane: 2^k * p(r) with x = k ln2 + r, |r| <= ln2 / 2, and p the Taylor polynomial of
// exp to the degree where its remainder is below half an ulp (7 for float, 13 for double). Vectors
// with a lane outside the range where 2^k is a normal number (or NaN) take std::exp lane by lane.
template <typename V>
inline V exp(V x) {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  using Bits = LaneBits<A>;
  using BitsV = typename LanesOf<Bits, sizeof(V) / sizeof(A)>::type;
  constexpr bool kDouble = sizeof(A) == 8;
  constexpr A kLow = kDouble ? -708.0 : -87.0, kHigh = kDouble ? 709.0 : 88.0;
  if (any(~((x >= kLow) & (x <= kHigh)))) {
    for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(A)); ++i) x[i] = std::exp(x[i]);
    return x;
  }
  constexpr A kRound = kDouble ? 6755399441055744.0 : 12582912.0f;  // 1.5 * 2^mantissa bits: rounds to integers
  constexpr A kLog2e = static_cast<A>(1.4426950408889634074);
  constexpr A kLn2High = kDouble ? 0.693147180369123816490 : 0.693145751953125f;  // exact in few bits
  constexpr A kLn2Low = kDouble ? 1.90821492927058770002e-10 : 1.428606765330187045e-06f;
  const V k = (x * kLog2e + kRound) - kRound;
  const V r = (x - k * kLn2High) - k * kLn2Low;
  constexpr int kDegree = kDouble ? 13 : 7;
  V p = splat<V>(A(1));
  for (int n = kDegree; n >= 1; --n) p = p * r * (A(1) / A(n)) + A(1);  // Horner: 1 + r/1 (1 + r/2 (...))
  const BitsV exponent = __builtin_convertvector(k, BitsV) << (kDouble ? 52 : 23);
  return (V)((BitsV)p + exponent);
}

}  // namespace linrec::cpu
