// The CPU lanes' vector arithmetic (ssm/lanes.h): the elementwise steps of step.h in vectors, sums
// across a vector's lanes, and the transposition of [step][lane] tiles to and from time rows.
#pragma once

#include <cstdint>
#include <utility>

#include "linrec/cpu/vector.h"

namespace linrec::ssm::lanes {

// The elementwise steps of step.h in vectors (cpu::exp takes std::exp lane by lane where a lane
// leaves its range, so infinities and NaN come out as the scalar functions give them).
template <typename V>
inline V sigmoid(V x) {
  return 1.0f / (1.0f + cpu::exp(-x));
}

// softplus(x) = max(x, 0) + log1p(t), t = exp(-|x|), with log1p(t) = 2 atanh(s), s = t / (2 + t) <=
// 1/3, by its odd series to s^13 (truncation below 2^-26 relative); x itself above 20, as torch does.
// With `slope`, also its derivative sigmoid(x) from the same t: 1 / (1 + t), or t / (1 + t) below 0.
template <typename V>
inline V softplus(V x, V* slope = nullptr) {
  const V t = cpu::exp(x < 0 ? x : -x);
  const V s = t / (2.0f + t), s2 = s * s;
  V series = cpu::splat<V>(1.0f / 13.0f);
  for (const float c : {1.0f / 11.0f, 1.0f / 9.0f, 1.0f / 7.0f, 1.0f / 5.0f, 1.0f / 3.0f}) series = series * s2 + c;
  const V log1p_t = 2.0f * (s * s2 * series + s);
  if (slope) {
    const V q = 1.0f / (1.0f + t);
    *slope = x > 20.0f ? cpu::splat<V>(1.0f) : x >= 0 ? q : t * q;
  }
  return x > 20.0f ? x : (x > 0 ? x : V{}) + log1p_t;
}

// The sum over the lanes of each of W vectors, v[bitreversed(i)] the i-th: lane i of the result. Each
// level adds the halves of every block of lanes of two vectors into one: log2(W) levels, W - 1 adds.
constexpr int bit_reversed(int i, int bits) {
  int r = 0;
  for (int k = 0; k < bits; ++k) r |= ((i >> k) & 1) << (bits - 1 - k);
  return r;
}
constexpr int log2_of(int w) { return w <= 1 ? 0 : 1 + log2_of(w / 2); }
// Lane `lane` of a fold of x and y (concatenated: 2W lanes) whose blocks of `block` lanes halve.
template <int W>
constexpr int fold_source(int lane, int block, int second) {
  const int half = block / 2, m = lane / half, o = lane % half;
  return (m % 2) * W + (m / 2) * block + o + second * half;
}
template <typename V, int W, int Block, int... L>
inline V fold(V x, V y, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(x, y, fold_source<W>(L, Block, 0)...) +
         __builtin_shufflevector(x, y, fold_source<W>(L, Block, 1)...);
}
template <typename V, int W, int Block>
inline void fold_level(V* v, int count) {
  if constexpr (Block >= 2) {
    for (int m = 0; m < count / 2; ++m) v[m] = fold<V, W, Block>(v[2 * m], v[2 * m + 1], std::make_integer_sequence<int, W>());
    fold_level<V, W, Block / 2>(v, count / 2);
  }
}
template <typename V, int W>
inline V lane_sums(V* v) {
  fold_level<V, W, W>(v, W);
  return v[0];
}

template <typename V>
inline V load(const float* source) {
  return cpu::load<V>(source);
}
template <typename V>
inline void store(float* target, V v) {
  cpu::store(target, v);
}

// Transposes W vectors of W lanes in place (v[i][l] <-> v[l][i]): log2(W) stages, each swapping the
// off-diagonal halves of every block of 2H rows and 2H lanes.
template <typename V, int W, int H, int... L>
inline V low_halves(V a, V b, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(a, b, ((L & H) ? W + L - H : L)...);
}
template <typename V, int W, int H, int... L>
inline V high_halves(V a, V b, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(a, b, ((L & H) ? W + L : L + H)...);
}
template <typename V, int W, int H = W / 2>
inline void transpose(V* v) {
  if constexpr (H >= 1) {
    for (int r = 0; r < W; ++r)
      if ((r & H) == 0) {
        const V a = v[r], b = v[r + H];
        v[r] = low_halves<V, W, H>(a, b, std::make_integer_sequence<int, W>());
        v[r + H] = high_halves<V, W, H>(a, b, std::make_integer_sequence<int, W>());
      }
    transpose<V, W, H / 2>(v);
  }
}

// [step][lane] <- `lanes` time rows (`stride` apart) of `steps` steps, W steps at a time loaded as
// vectors and transposed; lanes past them hold 0.
template <typename V, int W, typename T>
inline void gather(const T* rows, int64_t stride, int lanes, int steps, float* tile) {
  for (int i0 = 0; i0 < steps; i0 += W) {
    const int count = std::min(W, steps - i0);
    V v[W];
    for (int l = 0; l < W; ++l) v[l] = l < lanes ? cpu::load<V>(rows + l * stride + i0, 0, count, 0.0f) : V{};
    transpose<V, W>(v);
    for (int i = 0; i < W; ++i) store(tile + (i0 + i) * W, v[i]);
  }
}
template <typename V, int W, typename T>
inline void scatter(const float* tile, int64_t stride, int lanes, int steps, T* rows) {
  for (int i0 = 0; i0 < steps; i0 += W) {
    const int count = std::min(W, steps - i0);
    V v[W];
    for (int i = 0; i < W; ++i) v[i] = load<V>(tile + (i0 + i) * W);
    transpose<V, W>(v);
    for (int l = 0; l < lanes; ++l) cpu::store(rows + l * stride + i0, v[l], 0, count);
  }
}

}  // namespace linrec::ssm::lanes
