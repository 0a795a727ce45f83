// The elementwise arithmetic of the selective scan, shared by the CPU loop and the CUDA kernels so
// that both compute the same values: the step size's softplus, the gate's SiLU, the decay
// exp(delta * A) (real or complex), with their derivatives, and the readout of a complex state.
#pragma once

#include <cmath>
#include <type_traits>

#include "linrec/numeric.h"  // Complex, real_t
#include "linrec/params.h"  // LINREC_HOST_DEVICE

namespace linrec::ssm {

#if defined(__CUDA_ARCH__)
// 2^x by the exp2 unit (relative error below 2^-22), results under 2^-126 flushed to 0: exp2f's
// handling of subnormal results costs four more instructions.
__device__ __forceinline__ float exp2_unit(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}
#endif

// exp(x). In float on the GPU, the exp2 unit's: the kernels take it once per step and channel,
// where the correctly rounded one costs several times the instructions of a state dim's step.
template <typename S>
LINREC_HOST_DEVICE S fast_exp(S x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<S, float>) return exp2_unit(x * 1.4426950408889634f);
#endif
  using std::exp;
  return exp(x);
}

// softplus(x) = log(1 + exp(x)), and x itself above 20, as torch.nn.functional.softplus computes it.
template <typename S>
LINREC_HOST_DEVICE S softplus(S x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<S, float>) {
    // max(x, 0) + log(1 + t) with t = exp(-|x|) in [0, 1], and log(1 + t) = 2 atanh(s) for
    // s = t / (2 + t) <= 1/3: the odd series to s^13 (relative error below 2^-24), a fraction of
    // log1pf's instructions. A NaN x gives a NaN t.
    const float t = fast_exp(-fabsf(x));
    const float s = __fdividef(t, 2.0f + t), s2 = s * s;
    float series = 1.0f / 13.0f;
    series = fmaf(series, s2, 1.0f / 11.0f);
    series = fmaf(series, s2, 1.0f / 9.0f);
    series = fmaf(series, s2, 1.0f / 7.0f);
    series = fmaf(series, s2, 1.0f / 5.0f);
    series = fmaf(series, s2, 1.0f / 3.0f);
    const float log1p_t = 2.0f * fmaf(s * s2, series, s);
    return x > 20.0f ? x : fmaxf(x, 0.0f) + log1p_t;
  }
#endif
  using std::log1p;
  return x > S(20) ? x : log1p(fast_exp(x));
}

template <typename S>
LINREC_HOST_DEVICE S sigmoid(S x) {
#if defined(__CUDA_ARCH__)
  // The approximate division: 0 where 1 + exp(-x) overflows, as the quotient is then.
  if constexpr (std::is_same_v<S, float>) return __fdividef(1.0f, 1.0f + fast_exp(-x));
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

// exp(dt * A): the state's decay over one step; for a complex A, exp(dt Re A) times the rotation by
// dt Im A.
template <typename S>
LINREC_HOST_DEVICE S decay(real_t<S> dt, S A) {
  using std::cos;
  using std::exp;
  using std::sin;
  if constexpr (is_complex<S>::value) {
    const real_t<S> magnitude = exp(dt * A.re), angle = dt * A.im;
    return {magnitude * cos(angle), magnitude * sin(angle)};
  } else {
    return exp(dt * A);
  }
}

// What the output takes from a sum over the state dims of C x: the sum itself, or twice its real part
// for a complex state (whose state dims each stand for a conjugate pair, as in mamba_ssm).
template <typename S>
LINREC_HOST_DEVICE real_t<S> readout(S sum) {
  if constexpr (is_complex<S>::value) return 2 * sum.re;
  else return sum;
}

// The factor readout() applies: the gradient of the sum, d readout / d sum, under PyTorch's convention.
template <typename S>
constexpr real_t<S> kReadoutScale = is_complex<S>::value ? 2 : 1;

}  // namespace linrec::ssm
