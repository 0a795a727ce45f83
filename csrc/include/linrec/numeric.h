// The arithmetic every kernel shares: the accumulator type per element type, a complex type usable
// on host and device, pairs of channels scanned together, conjugation (for PyTorch's complex gradient convention) and the coefficient
// transform of log_coeffs.
#pragma once

#include <cmath>
#include <type_traits>

#include "linrec/params.h"  // LINREC_HOST_DEVICE

namespace linrec {

// Complex numbers as two reals, laid out like c10::complex and std::complex (so tensors' memory is
// read as is). Our own rather than std::complex: that one is host-only and its operator* checks for
// NaN/Inf on every multiply.
template <typename Real>
struct alignas(2 * sizeof(Real)) Complex {
  Real re, im;
  // Trivial default construction, as for float: arrays of Complex may live in __shared__ memory.
  Complex() = default;
  LINREC_HOST_DEVICE constexpr Complex(Real re_, Real im_ = Real(0)) : re(re_), im(im_) {}
};

template <typename Real>
LINREC_HOST_DEVICE Complex<Real> operator+(Complex<Real> a, Complex<Real> b) { return {a.re + b.re, a.im + b.im}; }

template <typename Real>
LINREC_HOST_DEVICE Complex<Real> operator-(Complex<Real> a, Complex<Real> b) { return {a.re - b.re, a.im - b.im}; }

template <typename Real>
LINREC_HOST_DEVICE Complex<Real> operator*(Complex<Real> a, Complex<Real> b) {
  return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}

// A complex number scaled by a real one (the selective scan's real step sizes and inputs).
template <typename Real>
LINREC_HOST_DEVICE Complex<Real> operator*(Complex<Real> a, Real b) { return {a.re * b, a.im * b}; }
template <typename Real>
LINREC_HOST_DEVICE Complex<Real> operator*(Real a, Complex<Real> b) { return {a * b.re, a * b.im}; }

template <typename Real>
LINREC_HOST_DEVICE Complex<Real>& operator+=(Complex<Real>& a, Complex<Real> b) { return a = a + b; }

// Two neighbouring channels that one thread scans side by side, each with its own recurrence: the
// 16-bit types along strided time load and store both with one 4-byte access (a warp then moves 128
// bytes per access, as for float32, where one 2-byte channel a lane moves 64).
template <typename Real>
struct alignas(2 * sizeof(Real)) ChannelPair {
  Real first, second;
  ChannelPair() = default;
  LINREC_HOST_DEVICE ChannelPair(Real both) : first(both), second(both) {}
  LINREC_HOST_DEVICE ChannelPair(Real first_, Real second_) : first(first_), second(second_) {}
  template <typename Other>
  LINREC_HOST_DEVICE explicit ChannelPair(const ChannelPair<Other>& other)
      : first(static_cast<Real>(other.first)), second(static_cast<Real>(other.second)) {}
};

template <typename Real>
LINREC_HOST_DEVICE ChannelPair<Real> operator+(ChannelPair<Real> a, ChannelPair<Real> b) {
  return {a.first + b.first, a.second + b.second};
}
template <typename Real>
LINREC_HOST_DEVICE ChannelPair<Real> operator*(ChannelPair<Real> a, ChannelPair<Real> b) {
  return {a.first * b.first, a.second * b.second};
}
template <typename Real>
LINREC_HOST_DEVICE bool operator==(ChannelPair<Real> a, ChannelPair<Real> b) {
  return a.first == b.first && a.second == b.second;
}
template <typename Real>
LINREC_HOST_DEVICE ChannelPair<Real> conj(ChannelPair<Real> value) { return value; }

template <typename T>
struct is_channel_pair : std::false_type {};
template <typename Real>
struct is_channel_pair<ChannelPair<Real>> : std::true_type {};

template <typename T>
struct is_complex : std::false_type {};
template <typename Real>
struct is_complex<Complex<Real>> : std::true_type {};

template <typename Real>
LINREC_HOST_DEVICE Complex<Real> conj(Complex<Real> value) { return {value.re, -value.im}; }
template <typename Real>
LINREC_HOST_DEVICE std::enable_if_t<std::is_floating_point_v<Real>, Real> conj(Real value) { return value; }

// The real type of a real or complex one.
template <typename T>
struct real_of {
  using type = T;
};
template <typename Real>
struct real_of<Complex<Real>> {
  using type = Real;
};
template <typename T>
using real_t = typename real_of<T>::type;

// Re(a * conj(b)): the real inner product of two complex numbers as 2-vectors (a * b for real ones),
// which is how a real quantity's gradient collects a complex one's under PyTorch's convention.
template <typename S>
LINREC_HOST_DEVICE real_t<S> real_dot(S a, S b) {
  if constexpr (is_complex<S>::value) return a.re * b.re + a.im * b.im;
  else return a * b;
}

// 16-bit element types are loaded into float and accumulated there; the rest accumulate as they are.
template <typename T>
struct accumulator {
  using type = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;
};
template <typename Real>
struct accumulator<ChannelPair<Real>> {
  using type = ChannelPair<typename accumulator<Real>::type>;
};
template <typename T>
using accumulator_t = typename accumulator<T>::type;

// Whether a value is exactly zero (both parts of a complex number or a channel pair).
template <typename Acc>
LINREC_HOST_DEVICE bool is_zero(const Acc& value) {
  if constexpr (is_complex<Acc>::value) return value.re == 0 && value.im == 0;
  else if constexpr (is_channel_pair<Acc>::value) return value.first == 0 && value.second == 0;
  else return value == Acc(0);
}

// Whether a value is finite (neither NaN nor +-Inf, in every part). x - x is 0 for finite x and NaN
// otherwise, so one comparison serves every accumulator type without a library call.
template <typename Acc>
LINREC_HOST_DEVICE bool is_finite(const Acc& value) {
  if constexpr (is_complex<Acc>::value) return is_finite(value.re) && is_finite(value.im);
  else if constexpr (is_channel_pair<Acc>::value) return is_finite(value.first) && is_finite(value.second);
  else return value - value == Acc(0);
}

// `coeff * state + value`, the state passed through a coefficient. A coefficient that is exactly zero
// drops the state rather than multiplying it: that is how a sequence start resets the state in the
// parallel kernels (its coefficient is set to 0), and a non-finite state before a start must not turn
// the new sequence into NaN (0 * Inf). Elsewhere the two agree for finite states, and a sequence whose
// state is non-finite is rescanned sequentially (nonfinite_rescan.h), which multiplies as the loop does.
// For channel pairs each channel decides for itself.
template <typename Acc>
LINREC_HOST_DEVICE Acc advance(const Acc& coeff, const Acc& state, const Acc& value) {
  if constexpr (is_channel_pair<Acc>::value) {
    return {advance(coeff.first, state.first, value.first), advance(coeff.second, state.second, value.second)};
  } else {
    return is_zero(coeff) ? value : coeff * state + value;
  }
}

// Whether the parallel scans of element type T carry the rounding error of their products of
// coefficients (block_scan.h): float32. A decay near 1 repeated step after step (an EMA's) makes every
// thread's and every tile's product the same value, rounded the same way, so that the error of a carry
// compounds along the sequence as if the decay were off by it. 16-bit outputs round far above that
// error (their decays more so: bfloat16 stores 0.999 as 1), and float64 keeps enough bits.
template <typename T>
constexpr bool kCompensated = std::is_same_v<T, float>;

// product_error() of an exact later coefficient, without the test for a zero product: the scans' items
// within a thread, whose map's error is set to 0 once where its product is 0 (block_scan.h).
LINREC_HOST_DEVICE float plain_product_error(float later, float earlier, float earlier_error, float product) {
  return fmaf(later, earlier_error, fmaf(later, earlier, -product));
}

// The error of the product of two float coefficients known as value + error each (`product` the
// rounded product of the values): the two-product's rounding by a fused multiply-add (Dekker 1971)
// plus the first-order terms of the errors. 0 where the product is 0 (a reset, or an underflow: a
// constant map). A non-finite product has a NaN error; the results it reaches are non-finite either
// way, and rescanned.
LINREC_HOST_DEVICE float product_error(float later, float later_error, float earlier, float earlier_error,
                                       float product) {
  if (product == 0.0f) return 0.0f;
  return fmaf(later, earlier_error, fmaf(later_error, earlier, fmaf(later, earlier, -product)));
}

// product_error() of an exact later coefficient (one step's).
LINREC_HOST_DEVICE float product_error(float later, float earlier, float earlier_error, float product) {
  if (product == 0.0f) return 0.0f;
  return plain_product_error(later, earlier, earlier_error, product);
}

// advance() with a coefficient known as coeff + error.
LINREC_HOST_DEVICE float advance(float coeff, float error, float state, float value) {
  return coeff == 0.0f ? value : fmaf(coeff, state, fmaf(error, state, value));
}

// The coefficient of two steps, `later` applied after `earlier`: their product, or the later one where
// it is zero (a reset stays a reset whatever came before it, Inf and NaN included).
template <typename Acc>
LINREC_HOST_DEVICE Acc compose_coefficients(const Acc& later, const Acc& earlier) {
  if constexpr (is_channel_pair<Acc>::value) {
    return {compose_coefficients(later.first, earlier.first), compose_coefficients(later.second, earlier.second)};
  } else {
    return is_zero(later) ? later : later * earlier;
  }
}

// A coefficient as the recurrence uses it: the stored value, or its exponential with log_coeffs
// (which the op layer refuses for complex types).
template <typename Acc>
LINREC_HOST_DEVICE Acc coefficient(Acc stored, bool log_coeffs) {
  if constexpr (is_complex<Acc>::value) {
    return stored;
  } else if constexpr (is_channel_pair<Acc>::value) {
    return {coefficient(stored.first, log_coeffs), coefficient(stored.second, log_coeffs)};
  } else {
    using std::exp;
    return log_coeffs ? exp(stored) : stored;
  }
}

// Coefficients given as logs (log_coeffs) become the coefficients. The parallel kernels call it under
// one branch per tile rather than per item, so that the exponentials are not evaluated when the flag
// is off.
template <typename Acc, int Items>
LINREC_HOST_DEVICE void exponentiate(Acc (&coeff)[Items]) {
  LINREC_UNROLL
  for (int i = 0; i < Items; ++i) coeff[i] = coefficient(coeff[i], true);
}

}  // namespace linrec
