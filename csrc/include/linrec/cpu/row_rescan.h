// The rows family's rescan of a sequence whose results hold a non-finite value (launch.h: why). The
// plain recurrence runs element after element up to its first non-finite state past the first
// non-finite result, storing from that result on (nonfinite_rescan.h: the results before it keep
// the row kernels' bits); from there the states are +-Inf or NaN, and vectors take the rest: a NaN
// state stays NaN at every later step, forward and backward, so the rest is filled with NaN without
// reading it; an infinite state goes on by row_scan.h's InfiniteSteps, whose window scan gives the
// loop's states exactly. Both write what the loop would, but for the bits of NaN.
#pragma once

#include <cstdint>
#include <utility>

#include "linrec/cpu/row_scan.h"
#include "linrec/numeric.h"

namespace linrec::cpu {

// The rescans of one element type T, coefficient type C, vector width, scan order and coefficient
// encoding (RowScanPass's), over a sequence [lo, hi) of the rows family.
template <typename T, typename C, int Bytes, Order O, bool LogCoeffs>
struct RowRescan {
  using Pass = RowScanPass<T, C, Bytes, O, LogCoeffs, false>;
  using A = typename Pass::A;
  using V = typename Pass::V;
  using Lanes = typename Pass::Lanes;
  static constexpr int W = Pass::W;
  template <typename Pointer>
  using Row = RowOperand<Pointer>;

  // Memory index of step n of [lo, hi) in scan order.
  static int64_t at(int64_t lo, int64_t hi, int64_t n) { return O == Order::Ascending ? lo + n : hi - 1 - n; }
  // The steps of [lo, hi) from step n on in scan order, as a memory range.
  static std::pair<int64_t, int64_t> from_step(int64_t lo, int64_t hi, int64_t n) {
    if constexpr (O == Order::Ascending) return {lo + n, hi};
    else return {lo, hi - n};
  }

  static A coeff_at(Row<const C*> coeffs, int64_t t) {
    return coefficient(static_cast<A>(coeffs.data[coeffs.unit ? t : 0]), LogCoeffs);
  }

  // The steps of [lo, hi) in scan order before the first non-finite value of `row`; -1 where all are
  // finite. A vector at a time (a scan's first vector starts at its first step: Lanes::of).
  static int64_t steps_before_nonfinite(const T* row, int64_t lo, int64_t hi) {
    using Bits = typename LanesOf<LaneBits<A>, W>::type;
    constexpr LaneBits<A> kInfinity = std::bit_cast<LaneBits<A>>(std::numeric_limits<A>::infinity());
    const int64_t vectors = (hi - lo + W - 1) / W;
    for (int64_t j = 0; j < vectors; ++j) {
      const V v = Pass::template load_row<false, true>(Row<const T*>{row, true}, Lanes::of(lo, hi, j), A(0));
      const Bits nonfinite = ((Bits)v & std::numeric_limits<LaneBits<A>>::max()) >= kInfinity;
      if (!any(nonfinite)) continue;
      for (int k = 0; k < W; ++k)
        if (nonfinite[O == Order::Ascending ? k : W - 1 - k]) return j * W + k;
    }
    return -1;
  }

  // Stores `value` to the elements [lo, hi) of `row`.
  template <typename Element>
  static void fill(Element* row, std::pair<int64_t, int64_t> range, A value) {
    const auto [lo, hi] = range;
    Pass::for_each_vector(lo, hi, true, [&]<bool Full, bool Unit>(int64_t j) {
      Pass::template store_row<Full>(row, splat<V>(value), Full ? Lanes::whole(lo, hi, j) : Lanes::of(lo, hi, j));
      return true;
    });
  }

  // The forward's outputs, entered with *initial (none: nullptr), as sequential_scan_forward gives them.
  static void forward(Row<const T*> inputs, Row<const C*> coeffs, T* outputs, int64_t lo, int64_t hi, const C* initial) {
    const int64_t from = steps_before_nonfinite(outputs, lo, hi);
    if (from < 0) return;
    const int64_t length = hi - lo;
    A state = initial != nullptr ? static_cast<A>(*initial) : A(0);
    int64_t n = 0;
    for (; n < length; ++n) {
      const int64_t t = at(lo, hi, n);
      const A input = static_cast<A>(inputs.data[inputs.unit ? t : 0]);
      // Without an initial state the first coefficient takes no part.
      state = n == 0 && initial == nullptr ? input : coeff_at(coeffs, t) * state + input;
      if (n < from) continue;
      outputs[t] = static_cast<T>(state);
      if (!is_finite(state)) break;
    }
    if (n + 1 >= length) return;
    const auto [rest_lo, rest_hi] = from_step(lo, hi, n + 1);
    if (state != state) return fill(outputs, {rest_lo, rest_hi}, state);
    Pass::template forward<kScan, InfiniteSteps>(inputs, coeffs, outputs, rest_lo, rest_hi, state, false);
  }

  // The backward's gradients (O its order, against the forward's), as sequential_scan_backward gives
  // them: d_inputs, d_coeffs, and d_initial where `initial` is given.
  static void backward(Row<const T*> d_outputs, Row<const C*> coeffs, const T* outputs, T* d_inputs, C* d_coeffs,
                       int64_t lo, int64_t hi, const C* initial, C* d_initial) {
    const int64_t from = steps_before_nonfinite(d_inputs, lo, hi);
    if (from < 0) return;
    const int64_t length = hi - lo;
    A d_state = A(0), next_coeff = A(0);  // the coefficient one step later in the forward's order
    int64_t n = 0;
    for (; n < length; ++n) {
      const int64_t t = at(lo, hi, n);
      d_state = next_coeff * d_state + static_cast<A>(d_outputs.data[d_outputs.unit ? t : 0]);
      const A coeff = coeff_at(coeffs, t);
      next_coeff = coeff;
      if (n < from) continue;
      d_inputs[t] = static_cast<T>(d_state);
      // The forward's first step has no state before it but the initial one.
      const bool has_prev = n + 1 < length;
      A d_coeff = A(0);
      if (has_prev || initial != nullptr) {
        const A prev = has_prev ? static_cast<A>(outputs[at(lo, hi, n + 1)]) : static_cast<A>(*initial);
        d_coeff = d_state * prev;
        if constexpr (LogCoeffs) d_coeff = d_coeff * coeff;  // d/d(log c) = c * d/dc
      }
      d_coeffs[t] = static_cast<C>(d_coeff);
      if (!is_finite(d_state)) break;
    }
    if (n + 1 >= length) {
      if (d_initial != nullptr) *d_initial = static_cast<C>(next_coeff * d_state);
      return;
    }
    const auto rest = from_step(lo, hi, n + 1);
    if (d_state != d_state) {
      // Every later gradient is NaN, but d_coeffs at the forward's first step without an initial state.
      fill(d_inputs, rest, d_state);
      fill(d_coeffs, rest, d_state);
      if (initial == nullptr) d_coeffs[at(lo, hi, length - 1)] = C(0);
      if (d_initial != nullptr) *d_initial = static_cast<C>(d_state);
      return;
    }
    const auto map = Pass::template backward<kScan, InfiniteSteps>(d_outputs, coeffs, Row<const T*>{outputs, true},
                                                                   d_inputs, d_coeffs, lo, hi, rest.first,
                                                                   rest.second, initial, d_state, false);
    if (d_initial != nullptr) *d_initial = static_cast<C>(coeff_at(coeffs, at(lo, hi, length - 1)) * map->last);
  }
};

}  // namespace linrec::cpu
