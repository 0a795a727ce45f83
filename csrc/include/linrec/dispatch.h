// The one place where runtime arguments become compile-time types and configs.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "linrec/numeric.h"
#include "linrec/params.h"

namespace linrec {

// Calls body.template operator()<T>() with the element type that stands for `dtype`. The 16-bit
// types are passed in because host code (torch's header-only c10::Half) and device code
// (__half, __nv_bfloat16) store them as different C++ types; complex types are linrec::Complex.
template <typename Half, typename BFloat16, typename Body>
decltype(auto) dispatch_dtype(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::Float32: return body.template operator()<float>();
    case DType::Float64: return body.template operator()<double>();
    case DType::Float16: return body.template operator()<Half>();
    case DType::BFloat16: return body.template operator()<BFloat16>();
    case DType::Complex64: return body.template operator()<Complex<float>>();
    case DType::Complex128: return body.template operator()<Complex<double>>();
  }
  throw std::invalid_argument("linrec: no kernel is compiled for dtype code " +
                              std::to_string(static_cast<int>(dtype)));
}

// Calls body.template operator()<T, C>() with the element types of inputs (T) and of coeffs and
// initial (C): C is T, or float for 16-bit T (SequenceLayout::coeff_dtype).
template <typename Half, typename BFloat16, typename Body>
void dispatch_dtypes(DType dtype, DType coeff_dtype, Body&& body) {
  dispatch_dtype<Half, BFloat16>(dtype, [&]<typename T>() {
    if (coeff_dtype == dtype) return body.template operator()<T, T>();
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      if (coeff_dtype == DType::Float32) return body.template operator()<T, float>();
    throw std::invalid_argument(std::string("linrec: no kernel is compiled for ") + dtype_name(dtype) +
                                " inputs with " + dtype_name(coeff_dtype) + " coefficients");
  });
}

// Calls body.template operator()<T, W, S>() with the fused selective scan's element types: T of u, delta,
// z and out (real); S of the state, accumulator_t<T> or, beside a complex A (`state` complex), its
// complex type; W of varying B and C: T, or S where they are wider than T (`wide`: float32 beside 16-bit
// T) or complex.
template <typename Half, typename BFloat16, typename Body>
void dispatch_scan_types(DType values, DType state, bool wide, Body&& body) {
  dispatch_dtype<Half, BFloat16>(values, [&]<typename T>() {
    if constexpr (!is_complex<T>::value) {
      using S = accumulator_t<T>;
      if (is_complex_dtype(state)) body.template operator()<T, Complex<S>, Complex<S>>();
      else if constexpr (std::is_same_v<T, S>) body.template operator()<T, T, S>();
      else if (wide) body.template operator()<T, S, S>();
      else body.template operator()<T, T, S>();
    }
  });
}

// Calls body.template operator()<Configs[index]>(): a plan's config (Plan::config) as a compile-time
// value.
template <auto Configs, typename Body>
void dispatch_config(int index, Body&& body) {
  const bool found = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((index == static_cast<int>(I) ? (body.template operator()<Configs[I]>(), true) : false) || ...);
  }(std::make_index_sequence<Configs.size()>());
  if (!found) throw std::invalid_argument("linrec: no kernel is compiled for config index " + std::to_string(index));
}

// Calls body.template operator()<V>() for the V among Values equal to `value` (a plan's variant, say).
template <auto... Values, typename Body>
void dispatch_value(decltype((Values, ...)) value, Body&& body) {
  const bool found = ((value == Values ? (body.template operator()<Values>(), true) : false) || ...);
  if (!found) throw std::invalid_argument("linrec: no kernel is compiled for value " + std::to_string(static_cast<int>(value)));
}

}  // namespace linrec
