// The elementwise arithmetic of the selective scan, shared by the CPU loop and the CUDA kernels so
// that both compute the same values: the step size's softplus, the gate's SiLU, and the decay
// exp(delta * A), with their derivatives.
#pragma once

#include <cmath>
#include <type_traits>

#include "linrec/params.h"  // LINREC_HOST_DEVICE

namespace linrec::ssm {

// exp(x). In float on the GPU, the exp2 unit's (relative error about 2^-21 where the result is
// normal): the kernels take it once per step and channel, where the correctly rounded one costs
// several times the instructions of a state dim's step.
template <typename S>
LINREC_HOST_DEVICE S fast_exp(S x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<S, float>) return __expf(x);
#endif
  using std::exp;
  return exp(x);
}

// softplus(x) = log(1 + exp(x)), and x itself above 20, as torch.nn.functional.softplus computes it.
template <typename S>
LINREC_HOST_DEVICE S softplus(S x) {
  using std::log1p;
  return x > S(20) ? x : log1p(fast_exp(x));
}

template <typename S>
LINREC_HOST_DEVICE S sigmoid(S x) {
#if defined(__CUDA_ARCH__)
  // The approximate division: 0 where 1 + exp(-x) overflows, as the quotient is then.
  if constexpr (std::is_same_v<S, float>) return __fdividef(1.0f, 1.0f + __expf(-x));
#endif
  return S(1) / (S(1) + fast_exp(-x));
}

// d softplus(x) / dx, with the same threshold.
template <typename S>
LINREC_HOST_DEVICE S softplus_slope(S x) {
  return x > S(20) ? S(1) : sigmoid(x);
}

template <typename S>
LINREC_HOST_DEVICE S silu(S x) { return x * sigmoid(x); }

// d silu(x) / dx.
template <typename S>
LINREC_HOST_DEVICE S silu_slope(S x) {
  const S s = sigmoid(x);
  return s * (S(1) + x * (S(1) - s));
}

// The step size: delta, shifted by the channel's bias, through softplus where asked.
template <typename S>
LINREC_HOST_DEVICE S step_size(S delta, S bias, bool delta_softplus) {
  const S shifted = delta + bias;
  return delta_softplus ? softplus(shifted) : shifted;
}

// exp(dt * A): the state's decay over one step.
template <typename S>
LINREC_HOST_DEVICE S decay(S dt, S A) {
  using std::exp;
  return exp(dt * A);
}

}  // namespace linrec::ssm
