// Device arithmetic shared by the selective scan's kernel families (ssm/blocks/,
// ssm/lanes/): the decay through the exp2 unit, and a warp's sum.
#pragma once

#include <type_traits>

#include "linrec/block_scan.h"  // shuffled
#include "linrec/ssm/step.h"

namespace linrec::ssm {

template <typename S>
__device__ __forceinline__ S warp_sum(S value) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += shuffled(value, [&](auto part) { return __shfl_xor_sync(0xffffffffu, part, offset); });
  return value;
}

// exp(dt * A) as exp2(dt * A log2(e)), A's factor taken once per state dim (A2 = A * log2(e), its
// real part for a complex A): one multiply and the exp2 unit's instruction per step (float; double
// takes exp). A complex decay turns by dt Im A, with sincosf's accurate sine and cosine: dt Im A
// reaches tens of radians, where the fast ones lose their accuracy.
template <typename S>
__device__ __forceinline__ S scaled_log2(S A) {
  if constexpr (std::is_same_v<S, float>) return A * 1.4426950408889634f;
  else if constexpr (std::is_same_v<S, Complex<float>>) return {A.re * 1.4426950408889634f, A.im};
  else return A;
}
template <typename S>
__device__ __forceinline__ S decay_from_log2(real_t<S> dt, S A2) {
  if constexpr (std::is_same_v<S, float>) {
    return exp2_unit(dt * A2);
  } else if constexpr (std::is_same_v<S, Complex<float>>) {
    float sine, cosine;
    sincosf(dt * A2.im, &sine, &cosine);
    const float magnitude = exp2_unit(dt * A2.re);
    return {magnitude * cosine, magnitude * sine};
  } else {
    return decay(dt, A2);
  }
}

}  // namespace linrec::ssm
