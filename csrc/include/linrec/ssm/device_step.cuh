// Device arithmetic shared by the selective scan's kernel families (ssm/kernels.cuh,
// ssm/lane_kernels.cuh): the decay through the exp2 unit, and a warp's sum.
#pragma once

#include <type_traits>

#include "linrec/ssm/step.h"

namespace linrec::ssm {

template <typename S>
__device__ __forceinline__ S warp_sum(S value) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// exp(dt * A) as exp2(dt * A log2(e)), A's factor taken once per state dim (A2 = A * log2(e)): one
// multiply and the exp2 unit's instruction per step (float; double takes exp).
template <typename S>
__device__ __forceinline__ S scaled_log2(S A) {
  if constexpr (std::is_same_v<S, float>) return A * 1.4426950408889634f;
  else return A;
}
template <typename S>
__device__ __forceinline__ S decay_from_log2(S dt, S A2) {
  if constexpr (std::is_same_v<S, float>) {
    return exp2_unit(dt * A2);
  } else {
    return decay(dt, A2);
  }
}

}  // namespace linrec::ssm
