// CPU kernels for sequences whose time dim is contiguous (time last): W consecutive steps of one
// sequence sit in the W lanes of a vector. The lanes are scanned in log2(W) steps of
// shift-multiply-add (each lane composes its map with the one Shift lanes before it), and the vector
// is then joined to the state carried from the one before: y = A * carry + B, with A the lanes'
// running coefficient products and B their states from zero. No transposition, no gather.
//
// Long sequences are cut into blocks of kBlockLength steps (in scan order from the sequence's first
// element). The state entering a block is always the previous block's map applied to the state
// entering that one, the map composed vector by vector: so a sequence split across threads (each
// thread reduces its blocks to their maps, then scans them from the states the maps give) computes
// the very same values as one thread scanning it alone, whatever the number of threads.
#pragma once

#include <cstdint>
#include <utility>

#include "linrec/cpu/vector.h"

namespace linrec::cpu {

// Steps of a sequence per block; a multiple of every vector's lane count.
constexpr int64_t kBlockLength = 1 << 12;

// The order a scan visits memory in: ascending (lane 0 first) or descending (the last lane first).
enum class Order { Ascending, Descending };

constexpr Order opposite(Order order) { return order == Order::Ascending ? Order::Descending : Order::Ascending; }

// Lane i of the result: lane i - Shift of v in scan order, or fill's lane i where there is none.
template <Order O, int Shift, typename V, std::size_t... I>
inline V shift_lanes(V v, V fill, std::index_sequence<I...>) {
  constexpr int W = sizeof...(I);
  if constexpr (O == Order::Ascending)
    return __builtin_shufflevector(fill, v, (static_cast<int>(I) >= Shift ? W + static_cast<int>(I) - Shift : static_cast<int>(I))...);
  else
    return __builtin_shufflevector(fill, v, (static_cast<int>(I) + Shift < W ? W + static_cast<int>(I) + Shift : static_cast<int>(I))...);
}

// Lanes that have a lane Shift before them in scan order (all bits set), and those that do not (0).
template <Order O, int Shift, typename M, std::size_t... I>
inline M lanes_with_source(std::index_sequence<I...>) {
  constexpr int W = sizeof...(I);
  return M{(O == Order::Ascending ? static_cast<int>(I) >= Shift : static_cast<int>(I) + Shift < W) ? -1 : 0 ...};
}

// The map s -> coeff * s + state of a span, composed vector by vector in scan order; `last` is the
// output at the span's last element in scan order (the backward's gradient at a sequence's start).
template <typename A>
struct SpanMap {
  A coeff, state, last;
};

// What a pass over a span does: write outputs, compose the span's map, or both.
enum Pass { kScan = 1, kMap = 2, kScanAndMap = 3 };

// The kernels of one element type, vector width, scan order and coefficient encoding.
template <typename T, int Bytes, Order O, bool LogCoeffs>
struct RowScan {
  using A = Acc<T>;
  using V = typename Vector<A, Bytes>::Values;
  using M = typename Vector<A, Bytes>::Mask;
  static constexpr int W = Vector<A, Bytes>::kLanes;
  static constexpr int kLast = O == Order::Ascending ? W - 1 : 0;  // the lane scanned last
  // A stored coefficient that is the identity map's (1): pads lanes past a sequence's end.
  static constexpr A kIdentityCoeff = LogCoeffs ? A(0) : A(1);

  // One operand's row: element t at data[t], or data[0] for every t (broadcast along time).
  template <typename Pointer>
  struct Row {
    Pointer data;
    bool unit;
  };

  using Map = SpanMap<A>;

  // Where the j-th vector of span [lo, hi) in scan order lies: memory index `base` is lane 0, lanes
  // [first, first + count) fall in the span.
  struct Lanes {
    int64_t base;
    int first, count;
    Lanes(int64_t lo, int64_t hi, int64_t j) {
      base = O == Order::Ascending ? lo + j * W : hi - (j + 1) * W;
      const int64_t begin = base < lo ? lo : base, end = base + W > hi ? hi : base + W;
      first = static_cast<int>(begin - base);
      count = static_cast<int>(end - begin);
    }
  };

  template <typename Pointer>
  static V load_row(Row<Pointer> row, const Lanes& lanes, A pad) {
    return row.unit ? load<V>(row.data + lanes.base + lanes.first, lanes.first, lanes.count, pad) : load_splat<V>(row.data);
  }

  static V coefficient(V stored) {
    if constexpr (LogCoeffs) return exp(stored);
    else return stored;
  }

  // Scans the lanes of (a, b) as maps s -> a s + b: afterwards lane i holds the composition of the
  // lanes up to i in scan order. A lane with no lane Shift before it keeps its b: multiplying the
  // missing neighbour's 0 by an infinite coefficient would make a NaN.
  static void scan_lanes(V& a, V& b) {
    [&]<int... Step>(std::integer_sequence<int, Step...>) { (scan_step<1 << Step>(a, b), ...); }(
        std::make_integer_sequence<int, __builtin_ctz(W)>());
  }

  template <int Shift>
  static void scan_step(V& a, V& b) {
    constexpr auto kLaneIndices = std::make_index_sequence<W>();
    const V from_b = shift_lanes<O, Shift>(b, V{}, kLaneIndices);
    const V from_a = shift_lanes<O, Shift>(a, splat<V>(A(1)), kLaneIndices);
    b = select(lanes_with_source<O, Shift, M>(kLaneIndices), a * from_b + b, b);
    a = a * from_a;
  }

  // Composes a vector's map (lane kLast of the scanned a and b) after the span's so far.
  static void compose(V& map_coeff, V& map_state, V a, V b, bool first_vector) {
    const V a_last = broadcast_lane<kLast>(a), b_last = broadcast_lane<kLast>(b);
    map_state = first_vector ? b_last : a_last * map_state + b_last;
    map_coeff = first_vector ? a_last : a_last * map_coeff;
  }

  // The forward recurrence over span [lo, hi) of one sequence, entered with `state` (`fresh`: no
  // state: the span is the sequence's start and has no initial state, so its first element is its input).
  template <Pass P>
  static Map forward(Row<const T*> inputs, Row<const T*> coeffs, T* outputs, int64_t lo, int64_t hi, A state, bool fresh) {
    V carry = splat<V>(state), map_coeff = splat<V>(A(1)), map_state{};
    const int64_t vectors = (hi - lo + W - 1) / W;
    for (int64_t j = 0; j < vectors; ++j) {
      const Lanes lanes(lo, hi, j);
      V b = load_row(inputs, lanes, A(0));
      V a = coefficient(load_row(coeffs, lanes, kIdentityCoeff));
      scan_lanes(a, b);
      const bool starts = fresh && j == 0;
      if constexpr ((P & kScan) != 0) {
        const V out = starts ? b : a * carry + b;
        store(outputs + lanes.base + lanes.first, out, lanes.first, lanes.count);
        carry = broadcast_lane<kLast>(out);
      }
      if constexpr ((P & kMap) != 0) compose(map_coeff, map_state, a, b, j == 0);
    }
    return {map_coeff[0], map_state[0], A(0)};
  }

  // The gradient recurrence over span [lo, hi), in this struct's order O (against the forward's),
  // of the sequence [sequence_lo, sequence_hi): d[t] = coeff(t') * d[t'] + d_outputs[t], t' the
  // element the forward scanned after t; d_inputs[t] = d[t], d_coeffs[t] = d[t] * outputs[t''] (t''
  // the element it scanned before t; the initial state, or no gradient, at the sequence's start),
  // times coeff(t) with log coefficients. `state` and `fresh` as for forward().
  template <Pass P>
  static Map backward(Row<const T*> d_outputs, Row<const T*> coeffs, Row<const T*> outputs, T* d_inputs, T* d_coeffs,
                      int64_t sequence_lo, int64_t sequence_hi, int64_t lo, int64_t hi, const T* initial, A state,
                      bool fresh) {
    // Memory offset of the element the forward scanned after a given one (its coefficient multiplies
    // this element's gradient), and the forward's first element of the sequence.
    constexpr int64_t kForwardNext = O == Order::Ascending ? -1 : 1;
    const int64_t forward_first = O == Order::Ascending ? sequence_hi - 1 : sequence_lo;
    const A initial_state = initial != nullptr ? static_cast<A>(*initial) : A(0);
    V carry = splat<V>(state), map_coeff = splat<V>(A(1)), map_state{};
    A last = A(0);
    const int64_t vectors = (hi - lo + W - 1) / W;
    for (int64_t j = 0; j < vectors; ++j) {
      const Lanes lanes(lo, hi, j);
      V b = load_row(d_outputs, lanes, A(0));
      V a = coefficient(load_row(coeffs, shifted(lanes, kForwardNext, sequence_lo, sequence_hi), kIdentityCoeff));
      scan_lanes(a, b);
      const bool starts = fresh && j == 0;
      if constexpr ((P & kScan) != 0) {
        const V d = starts ? b : a * carry + b;
        store(d_inputs + lanes.base + lanes.first, d, lanes.first, lanes.count);
        carry = broadcast_lane<kLast>(d);
        // outputs one step earlier in the forward's order; the initial state before its first element
        V previous = load_row(outputs, shifted(lanes, -kForwardNext, sequence_lo, sequence_hi), initial_state);
        V d_coeff = d * previous;
        if constexpr (LogCoeffs) d_coeff = d_coeff * coefficient(load_row(coeffs, lanes, kIdentityCoeff));
        const int64_t start_lane = forward_first - lanes.base;
        if (initial == nullptr && start_lane >= lanes.first && start_lane < lanes.first + lanes.count)
          d_coeff[start_lane] = A(0);  // the first coefficient takes no part without an initial state
        store(d_coeffs + lanes.base + lanes.first, d_coeff, lanes.first, lanes.count);
        if (j == vectors - 1) last = d[O == Order::Ascending ? lanes.first + lanes.count - 1 : lanes.first];
      }
      if constexpr ((P & kMap) != 0) compose(map_coeff, map_state, a, b, j == 0);
    }
    return {map_coeff[0], map_state[0], last};
  }

  // `lanes` moved by `offset` elements, its lanes restricted to those landing in [lo, hi).
  static Lanes shifted(Lanes lanes, int64_t offset, int64_t lo, int64_t hi) {
    const int64_t begin = lanes.base + lanes.first + offset, end = begin + lanes.count;
    const int64_t clamped_begin = begin < lo ? lo : begin, clamped_end = end > hi ? hi : end;
    Lanes moved = lanes;
    moved.base = lanes.base + offset;
    moved.first = static_cast<int>(clamped_begin - moved.base);
    moved.count = clamped_end > clamped_begin ? static_cast<int>(clamped_end - clamped_begin) : 0;
    return moved;
  }
};

}  // namespace linrec::cpu
