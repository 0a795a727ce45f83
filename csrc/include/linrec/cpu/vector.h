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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
// Whether any bit of a vector is set: one test instruction (a loop over the lanes costs a short
// sequence's whole scan).
namespace native {
__attribute__((target("avx512f"))) inline bool any_bit(__m512i v) { return _mm512_test_epi32_mask(v, v) != 0; }
__attribute__((target("avx"))) inline bool any_bit(__m256i v) { return !_mm256_testz_si256(v, v); }
inline bool any_bit(__m128i v) { return _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) != 0xFFFF; }
}  // namespace native
#endif

// Whether any lane of a mask (a vector compare's result) is set.
template <typename M>
inline bool any(M mask) {
#if defined(__x86_64__)
  if constexpr (sizeof(M) == 64) return native::any_bit((__m512i)mask);
  else if constexpr (sizeof(M) == 32) return native::any_bit((__m256i)mask);
  else if constexpr (sizeof(M) == 16) return native::any_bit((__m128i)mask);
#endif
  for (int i = 0; i < static_cast<int>(sizeof(M) / sizeof(mask[0])); ++i)
    if (mask[i]) return true;
  return false;
}

// Lanes [first, first + count) of a vector of Lanes lanes: all ones there, zero elsewhere (the
// integer lanes of an Acc's width).
template <typename A, int Lanes, std::size_t... I>
inline typename LanesOf<LaneBits<A>, Lanes>::type lane_range(int first, int count, std::index_sequence<I...>) {
  using Unsigned = std::make_unsigned_t<LaneBits<A>>;
  using Offsets = typename LanesOf<Unsigned, Lanes>::type;
  constexpr Offsets kIndices = {static_cast<Unsigned>(I)...};
  // One unsigned compare: lanes before `first` wrap around to large offsets.
  return (typename LanesOf<LaneBits<A>, Lanes>::type)(kIndices - static_cast<Unsigned>(first) < static_cast<Unsigned>(count));
}
template <typename A, int Lanes>
inline auto lane_range(int first, int count) {
  return lane_range<A, Lanes>(first, count, std::make_index_sequence<Lanes>());
}

// v with lane `lane` replaced by `value`: a compare and a blend (assigning v[lane] goes through
// memory, and the whole vector's next load then waits for the store).
template <typename V>
inline V with_lane(V v, int lane, decltype(V{}[0]) value) {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  return lane_range<A, sizeof(V) / sizeof(A)>(lane, 1) ? splat<V>(value) : v;
}

#if defined(__x86_64__)
// The intrinsics' type of a vector of Bytes bytes of AccBytes-byte floats (none for 16 bytes: the
// baseline takes no intrinsics).
template <std::size_t Bytes, std::size_t AccBytes>
struct NativeOf {
  using type = void;
};
template <>
struct NativeOf<64, 4> { using type = __m512; };
template <>
struct NativeOf<64, 8> { using type = __m512d; };
template <>
struct NativeOf<32, 4> { using type = __m256; };
template <>
struct NativeOf<32, 8> { using type = __m256d; };

// Fused multiply-adds of the x86-64 vector widths that have them. Each carries its own target, so
// that only isa.h's AVX2 and AVX-512 variants (whose targets include it) inline one.
namespace fused {
__attribute__((target("avx512f"))) inline __m512 multiply_add(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
__attribute__((target("avx512f"))) inline __m512d multiply_add(__m512d a, __m512d b, __m512d c) { return _mm512_fmadd_pd(a, b, c); }
__attribute__((target("fma"))) inline __m256 multiply_add(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
__attribute__((target("fma"))) inline __m256d multiply_add(__m256d a, __m256d b, __m256d c) { return _mm256_fmadd_pd(a, b, c); }
}  // namespace fused
#endif

// a * b + c in every lane: rounded once on the vector widths of x86-64 that have a fused
// multiply-add (32 and 64 bytes, used only by the AVX2 and AVX-512 variants), else twice. Explicit,
// because the build turns off the compiler's contraction: contracting differently in different
// inlined copies of a kernel made a sequence's result depend on the number of threads.
template <typename V>
inline V multiply_add(V a, V b, V c) {
#if defined(__x86_64__)
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  if constexpr (sizeof(V) == 64 || sizeof(V) == 32) {
    using Native = typename NativeOf<sizeof(V), sizeof(A)>::type;
    return (V)fused::multiply_add((Native)a, (Native)b, (Native)c);
  }
#endif
  return a * b + c;
}

// The rounding error of `product` = a * b, exactly (Dekker's two-product): a * b - product by one
// fused multiply-add on the widths that have one (AVX2, AVX-512), else from Veltkamp's split of each
// factor into halves whose products are exact. The 16-byte vectors (SSE2, NEON) take the split:
// multiply_add rounds twice there, which loses the error altogether (float32 with decays near one
// then read 40x the float32 loop's error on the baseline kernels).
template <typename V>
inline V product_error(V a, V b, V product) {
#if defined(__x86_64__)
  if constexpr (sizeof(V) == 64 || sizeof(V) == 32) return multiply_add(a, b, -product);
#endif
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  constexpr A kSplitter = sizeof(A) == 8 ? A(134217729.0) : A(4097.0);  // 2^27 + 1, 2^12 + 1
  const V scaled_a = kSplitter * a, a_high = scaled_a - (scaled_a - a), a_low = a - a_high;
  const V scaled_b = kSplitter * b, b_high = scaled_b - (scaled_b - b), b_low = b - b_high;
  return ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low;
}

// The element type a kernel computes in: float for the 16-bit types, else the stored type.
template <typename T>
using Acc = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;

#if defined(__x86_64__)
// Lanes [first, first + count) of an AVX-512 vector as mask bits (count below the lane count).
inline unsigned lane_bits(int first, int count) { return ((1u << count) - 1) << first; }

// Masked loads and stores of the x86-64 vector widths that have them (lanes outside the mask are
// neither read nor written, so a vector may reach past a tensor's end), each with its own target as
// in `fused`. AVX-512 masks are bits; AVX2's are lanes of all ones.
namespace masked {
__attribute__((target("avx512f"))) inline __m512 load(const float* lanes, __mmask16 mask, __m512 fill) { return _mm512_mask_loadu_ps(fill, mask, lanes); }
__attribute__((target("avx512f"))) inline __m512d load(const double* lanes, __mmask8 mask, __m512d fill) { return _mm512_mask_loadu_pd(fill, mask, lanes); }
__attribute__((target("avx512bw,avx512vl"))) inline __m256i load(const uint16_t* lanes, __mmask16 mask) { return _mm256_maskz_loadu_epi16(mask, lanes); }
__attribute__((target("avx"))) inline __m256 load(const float* lanes, __m256i mask) { return _mm256_maskload_ps(lanes, mask); }
__attribute__((target("avx"))) inline __m256d load(const double* lanes, __m256i mask) { return _mm256_maskload_pd(lanes, mask); }
__attribute__((target("avx512f"))) inline void store(float* lanes, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(lanes, mask, v); }
__attribute__((target("avx512f"))) inline void store(double* lanes, __mmask8 mask, __m512d v) { _mm512_mask_storeu_pd(lanes, mask, v); }
__attribute__((target("avx512bw,avx512vl"))) inline void store(uint16_t* lanes, __mmask16 mask, __m256i v) { _mm256_mask_storeu_epi16(lanes, mask, v); }
__attribute__((target("avx"))) inline void store(float* lanes, __m256i mask, __m256 v) { _mm256_maskstore_ps(lanes, mask, v); }
__attribute__((target("avx"))) inline void store(double* lanes, __m256i mask, __m256d v) { _mm256_maskstore_pd(lanes, mask, v); }
}  // namespace masked
#endif

// The bits of Lanes bfloat16 lanes stored in 16-bit lanes, and their conversion to and from float.
template <int Lanes>
using BFloat16Bits = typename LanesOf<uint16_t, Lanes>::type;

template <typename V, int Lanes>
inline V from_bfloat16(BFloat16Bits<Lanes> stored) {  // bfloat16 is the upper half of a float
  return (V)(__builtin_convertvector(stored, typename LanesOf<uint32_t, Lanes>::type) << 16);
}

template <int Lanes, typename V>
inline BFloat16Bits<Lanes> to_bfloat16(V v) {  // rounded to nearest even, NaN to the quiet NaN, as c10::BFloat16 does
  using Bits = typename LanesOf<uint32_t, Lanes>::type;
  const Bits bits = (Bits)v;
  const Bits rounded = (bits + ((bits >> 16) & 1) + 0x7FFF) >> 16;
  const Bits nan = (Bits)(v != v);
  return __builtin_convertvector((nan & 0x7FC0) | (~nan & rounded), BFloat16Bits<Lanes>);
}

// Loads `count` elements of T from `source` into lanes [first, first + count) of a vector of Acc; the
// other lanes hold `pad`. Full vectors (first == 0, count == all lanes) are one load and a conversion;
// partial ones one masked load where the target has it.
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
#if defined(__x86_64__)
    using Native = typename NativeOf<sizeof(V), sizeof(A)>::type;
    if constexpr (sizeof(V) == 64)
      return (V)masked::load(source - first, lane_bits(first, count), (Native)splat<V>(pad));
    if constexpr (sizeof(V) == 32) {
      const auto in_range = lane_range<A, kLanes>(first, count);
      return in_range ? (V)masked::load(source - first, (__m256i)in_range) : splat<V>(pad);
    }
#endif
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    BFloat16Bits<kLanes> stored;
    if (count == kLanes) {
      std::memcpy(&stored, source, sizeof(stored));
      return from_bfloat16<V, kLanes>(stored);
    }
#if defined(__x86_64__)
    if constexpr (sizeof(V) == 64) {
      stored = (BFloat16Bits<kLanes>)masked::load(reinterpret_cast<const uint16_t*>(source - first), lane_bits(first, count));
      return lane_range<A, kLanes>(first, count) ? from_bfloat16<V, kLanes>(stored) : splat<V>(pad);
    }
#endif
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
#if defined(__x86_64__)
    using Native = typename NativeOf<sizeof(V), sizeof(A)>::type;
    if constexpr (sizeof(V) == 64) return masked::store(target - first, lane_bits(first, count), (Native)v);
    if constexpr (sizeof(V) == 32) return masked::store(target - first, (__m256i)lane_range<A, kLanes>(first, count), (Native)v);
#endif
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const BFloat16Bits<kLanes> stored = to_bfloat16<kLanes>(v);
    if (count == kLanes) {
      std::memcpy(target, &stored, sizeof(stored));
      return;
    }
#if defined(__x86_64__)
    if constexpr (sizeof(V) == 64)
      return masked::store(reinterpret_cast<uint16_t*>(target - first), lane_bits(first, count), (__m256i)stored);
#endif
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
  // Horner's scheme on the coefficients 1/k!, one multiply-add a degree.
  constexpr int kDegree = kDouble ? 13 : 7;
  A factorial = 1;
  for (int n = 2; n <= kDegree; ++n) factorial *= n;
  V p = splat<V>(A(1) / factorial);
  for (int n = kDegree; n >= 1; --n) {
    factorial /= n;
    p = multiply_add(p, r, splat<V>(A(1) / factorial));
  }
  const BitsV exponent = __builtin_convertvector(k, BitsV) << (kDouble ? 52 : 23);
  return (V)((BitsV)p + exponent);
}

}  // namespace linrec::cpu
