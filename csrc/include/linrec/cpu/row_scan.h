// CPU kernels for sequences whose time dim is contiguous (time last): W consecutive steps of one
// sequence sit in the W lanes of a vector. Lane i of vector j is composed, in log2(W) steps of
// shift-multiply-add, with the W - 1 steps before it (the window ending there, reaching into vector
// j - 1: its lanes at each step are kept), so that the output is y_j = A_j * y_{j-1} + B_j lane by
// lane, A and B the window's coefficient product and state from zero. The dependency between
// vectors is then one fused multiply-add in each lane, with no lane broadcast on it. Windows of the
// first vector of a span start at the span's start, where y_{-1} is the entering state in every
// lane. No transposition, no gather.
//
// Long sequences are cut into blocks of kBlockLength steps (in scan order from the sequence's first
// element). The state entering a block is always the previous block's map applied to the state
// entering that one, the map composed vector by vector: so a sequence split across threads (each
// thread reduces its blocks to their maps, then scans them from the states the maps give) computes
// the very same values as one thread scanning it alone, whatever the number of threads.
//
// float32 products of coefficients carry their rounding error (Product, kCompensated in numeric.h).
// A sequence that repeats one
// coefficient (an EMA's decay) has the same window product in every vector, rounded the same way, and
// the carry from vector to vector compounds that one rounding as if the decay were off by it: over the
// 1 / (1 - c) steps an output remembers, its error would grow with their number, where the loop's
// grows with its square root (20x the loop's error on rows of 2^16 steps with c in [0.999, 1]).
// Compensation doubles the work of the lane scan, and it only matters where the carried products
// are large: a carry by window products of magnitude at most kCarryBound shrinks what it carries
// at least fourfold each vector, so that a rounding carried along adds up to a third of one vector's
// own. A span is therefore scanned without compensation first, watching the window products its
// inner vectors carry by; where one exceeds kCarryBound, the span is scanned again, compensated. The
// choice depends on the span's values alone, so results stay the same bits whatever the threads.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "linrec/cpu/vector.h"
#include "linrec/numeric.h"

namespace linrec::cpu {

// Steps of a sequence per block; a multiple of every vector's lane count.
constexpr int64_t kBlockLength = 1 << 12;

// The largest magnitude of a window product (W coefficients) that an uncompensated span carries by.
constexpr float kCarryBound = 0.25f;
// Inner vectors between two looks at the carried products: an uncompensated pass of a span whose
// products are large stops within this many vectors.
constexpr int64_t kCarryWatchPeriod = 8;

// The order a scan visits memory in: ascending (lane 0 first) or descending (the last lane first).
enum class Order { Ascending, Descending };

constexpr Order opposite(Order order) { return order == Order::Ascending ? Order::Descending : Order::Ascending; }

// Lane i of the result: the lane Shift lanes before lane i in scan order, of v and then of `before`
// (the vector scanned before v): one lane-concatenating shift.
template <Order O, int Shift, typename V, std::size_t... I>
inline V shift_lanes(V v, V before, std::index_sequence<I...>) {
  constexpr int W = sizeof...(I);
  if constexpr (O == Order::Ascending)
    return __builtin_shufflevector(before, v, (W + static_cast<int>(I) - Shift)...);
  else
    return __builtin_shufflevector(v, before, (static_cast<int>(I) + Shift)...);
}

// A product of coefficients as value + error, error the rounding error of the multiplications that
// formed value (two-product, Dekker 1971: vector.h's product_error), to first order; 0 unless
// Compensated. A non-finite product has a NaN error: the outputs it reaches are non-finite either way,
// and rescanned.
template <typename V, bool Compensated>
struct Product {
  V value, error;

  // The product of this one (later) and `earlier`.
  Product times(const Product& earlier) const {
    const V product = value * earlier.value;
    if constexpr (!Compensated) return {product, V{}};
    const V rounding = product_error(value, earlier.value, product);
    return {product, multiply_add(value, earlier.error, multiply_add(error, earlier.value, rounding))};
  }
  // The product of two exact factors, this one (later) and `earlier`: the error is the rounding alone.
  static Product of_exact(V later, V earlier) {
    const V product = later * earlier;
    if constexpr (!Compensated) return {product, V{}};
    return {product, product_error(later, earlier, product)};
  }
  // product * state + offset.
  V apply(V state, V offset) const {
    if constexpr (!Compensated) return multiply_add(value, state, offset);
    return multiply_add(value, state, multiply_add(error, state, offset));
  }
};

// The map s -> (coeff + coeff_error) * s + state of a span, composed vector by vector in scan order;
// `last` is the output at the span's last element in scan order (the backward's gradient at a
// sequence's start).
// `nonfinite`: the pass wrote a result that is not finite (NonfiniteWitness).
template <typename A>
struct SpanMap {
  A coeff, coeff_error, state, last;
  bool nonfinite = false;
};

// Whether a kernel stored a result that is not finite in T: NaN, +-Inf, or for a 16-bit T a float
// beyond its range, which rounds to +-Inf. Noted in registers, vector by vector as the results are
// stored (launch.h: such a sequence is rescanned); a separate pass over the stored results cost
// more than the scan itself.
template <typename T, typename V>
class NonfiniteWitness {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  static constexpr int W = sizeof(V) / sizeof(A);
  using Bits = typename LanesOf<LaneBits<A>, W>::type;
  static constexpr bool kNarrow = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;
  // 16-bit T: the bits of the smallest float magnitude T rounds to Inf (round to nearest even: half
  // way past its largest finite value, whose last significand bit is odd). NaN and Inf lie above it.
  static constexpr LaneBits<A> kOverflowBits = std::is_same_v<T, c10::Half> ? 0x477FF000 : 0x7F7F8000;
  V product_with_zero{};  // NaN in a lane once Inf or NaN was noted there (Inf * 0, NaN * 0)
  Bits largest{};         // 16-bit T: the largest magnitude's bits noted in each lane

 public:
  // Whether the kernels note every vector of results (note_each), or only a pass's last (note_last).
  // Lane i of a pass's results is a chain: each vector's is c * (the previous vector's) + b, and
  // c * s + b is Inf or NaN for every c and b once s is (c * Inf is +-Inf, or NaN for c = 0), so a
  // non-finite result in a lane reaches that lane of the last vector, pad lanes included. A 16-bit T's
  // float beyond its range is finite and need not persist, so those are noted vector by vector.
  static constexpr bool kEveryVector = kNarrow;

  void note_each(V v) {
    if constexpr (kEveryVector) note(v);
  }
  void note_last(V v) {
    if constexpr (!kEveryVector) note(v);
  }

  bool found() const {
    if constexpr (kNarrow) return any(largest >= kOverflowBits);
    // Finite lanes hold +0 exactly (v * 0 + 0, from +0: a sum of zeros is -0 only where both are),
    // so a set bit is a NaN: one test, where a float compare took two more instructions on the
    // sequence's last dependency chain.
    else return any((Bits)product_with_zero);
  }

 private:
  // Notes every lane of a vector of results, the pad lanes of a partial one too: those follow the
  // span's lanes in scan order (Lanes::of), with identity steps that repeat the span's last result
  // (or, for operands broadcast along time, a real step from it, which is finite unless that result
  // times the coefficient overflows: the rescan then finds no non-finite result and changes
  // nothing). Masking them cost a select that GCC lowered lane by lane (bfloat16 65536 x 16 forward:
  // 16 ns a sequence with it, 10.5 without).
  void note(V v) {
    // Integer compares: GCC lowers float compares of vector extensions lane by lane.
    if constexpr (kNarrow) {
      const Bits magnitude = (Bits)v & std::numeric_limits<LaneBits<A>>::max();
      largest = magnitude > largest ? magnitude : largest;
    }
    else product_with_zero = multiply_add(v, V{}, product_with_zero);
  }
};

// What a pass over a span does: write outputs, compose the span's map, or both.
enum Pass { kScan = 1, kMap = 2, kScanAndMap = 3 };

// The steps a pass scans: the recurrence's own (LoopSteps), or those that give its states once they
// are non-finite (InfiniteSteps, row_rescan.h). Past a state of +-Inf every state is +-Inf or NaN:
// c * s + x only sets the sign of an infinite s (c's sign) or turns it NaN (c zero or NaN, x NaN or the
// infinity of the other sign), so the loop's states there are those of s = c' * s + x', c' the sign
// of c (NaN where c is 0 or NaN) and x' = x where x is not finite, else 0. Its products of
// coefficients are +-1 or NaN and its sums infinities of one sign or NaN: exact in any order, so that
// the window scan gives the loop's states.
struct LoopSteps {
  template <typename V>
  static void transform(V&, V&) {}
};

struct InfiniteSteps {
  template <typename V>
  static void transform(V& coeff, V& input) {
    using A = std::remove_cvref_t<decltype(V{}[0])>;
    using Bits = typename LanesOf<LaneBits<A>, sizeof(V) / sizeof(A)>::type;
    constexpr LaneBits<A> kMagnitude = std::numeric_limits<LaneBits<A>>::max();
    constexpr LaneBits<A> kInfinity = std::bit_cast<LaneBits<A>>(std::numeric_limits<A>::infinity());
    constexpr LaneBits<A> kNan = std::bit_cast<LaneBits<A>>(std::numeric_limits<A>::quiet_NaN());
    constexpr LaneBits<A> kOne = std::bit_cast<LaneBits<A>>(A(1));
    // Integer compares: GCC lowers float compares of vector extensions lane by lane.
    const Bits c = (Bits)coeff, c_magnitude = c & kMagnitude;
    const Bits sign = (c & ~kMagnitude) | kOne;
    coeff = (V)((c_magnitude == 0) | (c_magnitude > kInfinity) ? splat<Bits>(kNan) : sign);
    input = (V)(((Bits)input & kMagnitude) >= kInfinity ? (Bits)input : Bits{});
  }
};

// One operand's row: element t at data[t], or data[0] for every t (broadcast along time).
template <typename Pointer>
struct RowOperand {
  Pointer data;
  bool unit;
};

// The largest magnitude among the window products an uncompensated pass carries by (Watched).
template <typename V>
class CarryWatch {
  using A = std::remove_cvref_t<decltype(V{}[0])>;
  using Bits = typename LanesOf<LaneBits<A>, sizeof(V) / sizeof(A)>::type;
  using UnsignedBits = std::make_unsigned_t<LaneBits<A>>;
  using Unsigned = typename LanesOf<UnsignedBits, sizeof(V) / sizeof(A)>::type;
  // Magnitudes compared as the integers of their bits, which order them (NaN above Inf); GCC lowers
  // float compares of vector extensions lane by lane. Shifted by kShift, the finite ones are positive
  // and the non-finite ones (Inf's bits and up) wrap to negative integers, which the signed maximum
  // leaves out: one addition a vector where a compare and a select took two.
  static constexpr LaneBits<A> kBoundBits = std::bit_cast<LaneBits<A>>(static_cast<A>(kCarryBound));
  static constexpr UnsignedBits kInfinityBits = std::bit_cast<UnsignedBits>(std::numeric_limits<A>::infinity());
  static constexpr UnsignedBits kShift = (UnsignedBits(1) << (8 * sizeof(A) - 1)) - kInfinityBits;
  Bits largest{};  // below every shifted finite magnitude (at least kShift)

 public:
  // Non-finite products are left out: the results they reach are rescanned (launch.h), and a NaN or
  // Inf at one step must not change how the steps before it are scanned (not a bit of their results).
  void note(V products) {
    const Bits magnitude = (Bits)products & std::numeric_limits<LaneBits<A>>::max();
    const Bits shifted = (Bits)((Unsigned)magnitude + kShift);
    largest = shifted > largest ? shifted : largest;
  }
  bool exceeded() const { return any(largest > static_cast<LaneBits<A>>(kBoundBits + kShift)); }
};

// One pass of the kernels of one element type T of inputs and outputs (and their gradients), element
// type C of coeffs and initial (and theirs: T, or float for 16-bit T, which shares T's accumulator),
// vector width, scan order and coefficient encoding, with products of coefficients Compensated or
// not. RowScan below chooses between the two.
template <typename T, typename C, int Bytes, Order O, bool LogCoeffs, bool Compensated>
struct RowScanPass {
  using A = Acc<T>;
  using V = typename Vector<A, Bytes>::Values;
  using Coeffs = Product<V, Compensated>;
  // An uncompensated pass of coefficients that need compensation where their carried products are
  // large: it watches them and gives up (returns no map) where they are.
  static constexpr bool kWatched = kCompensated<C> && !Compensated;
  static constexpr int W = Vector<A, Bytes>::kLanes;
  static constexpr int kLast = O == Order::Ascending ? W - 1 : 0;  // the lane scanned last
  // A stored coefficient that is the identity map's (1): pads lanes past a sequence's end.
  static constexpr A kIdentityCoeff = LogCoeffs ? A(0) : A(1);

  template <typename Pointer>
  using Row = RowOperand<Pointer>;

  using Map = SpanMap<A>;

  // Where the j-th vector of span [lo, hi) in scan order lies: memory index `base` is lane 0, lanes
  // [first, first + count) fall in the span.
  struct Lanes {
    int64_t base;
    int first, count;

    static Lanes of(int64_t lo, int64_t hi, int64_t j) {
      const int64_t base = O == Order::Ascending ? lo + j * W : hi - (j + 1) * W;
      const int64_t begin = base < lo ? lo : base, end = base + W > hi ? hi : base + W;
      return {base, static_cast<int>(begin - base), end > begin ? static_cast<int>(end - begin) : 0};
    }
    // Vector j of an inner vector: all lanes in the span.
    static Lanes whole(int64_t lo, int64_t hi, int64_t j) {
      return {O == Order::Ascending ? lo + j * W : hi - (j + 1) * W, 0, W};
    }
    // Moved by `offset` elements, its lanes restricted to those landing in [lo, hi).
    Lanes shifted(int64_t offset, int64_t lo, int64_t hi) const {
      Lanes moved = *this;
      moved.base = base + offset;
      const int64_t begin = base + first + offset, end = begin + count;
      const int64_t clamped_begin = begin < lo ? lo : begin, clamped_end = end > hi ? hi : end;
      moved.first = static_cast<int>(clamped_begin - moved.base);
      moved.count = clamped_end > clamped_begin ? static_cast<int>(clamped_end - clamped_begin) : 0;
      return moved;
    }
  };

  // Vector `lanes` of `row`. Full: every lane falls in the span (no pad); Unit: the row is known to
  // step by 1 (the loop over a span's inner vectors is compiled once for operands that all do).
  template <bool Full, bool Unit, typename Pointer>
  static V load_row(Row<Pointer> row, const Lanes& lanes, A pad) {
    if (!(Unit || row.unit)) return load_splat<V>(row.data);
    if constexpr (Full) return load<V>(row.data + lanes.base);
    else return load<V>(row.data + lanes.base + lanes.first, lanes.first, lanes.count, pad);
  }

  // Element `index` of `row`, or `pad` outside [lo, hi).
  template <typename Pointer>
  static A element(Row<Pointer> row, int64_t index, int64_t lo, int64_t hi, A pad) {
    if (index < lo || index >= hi) return pad;
    return static_cast<A>(row.data[row.unit ? index : 0]);
  }

  template <bool Full, typename Element>
  static void store_row(Element* row, V v, const Lanes& lanes) {
    if constexpr (Full) store(row + lanes.base, v);
    else store(row + lanes.base + lanes.first, v, lanes.first, lanes.count);
  }

  static V coefficient(V stored) {
    if constexpr (LogCoeffs) return exp(stored);
    else return stored;
  }

  // The lane of `lanes` scanned first.
  static int first_lane(const Lanes& lanes) { return O == Order::Ascending ? lanes.first : lanes.first + lanes.count - 1; }

  static constexpr int kScanSteps = __builtin_ctz(W);

  static Coeffs identity_product() { return {splat<V>(A(1)), V{}}; }
  // The coefficients of a vector as products of one factor each (exact: no error).
  static Coeffs exact(V coeff) { return {coeff, V{}}; }

  // The lanes of the vector scanned before, at each step of scan_windows (the identity map's lanes
  // before a span's first vector: its windows start at the span's start).
  struct Windows {
    Coeffs coeff[kScanSteps];
    V state[kScanSteps];

    Windows() {
      for (int step = 0; step < kScanSteps; ++step) coeff[step] = identity_product(), state[step] = V{};
    }
  };

  // Scans the lanes of (a, b) as maps s -> a s + b: afterwards lane i holds the composition of the W
  // lanes up to i in scan order, those before this vector's taken from `before`'s record of the
  // previous vector (b: the state from zero; a: the product of the coefficients). A sequence's first
  // coefficient, which takes no part, is zeroed before.
  static void scan_windows(Coeffs& a, V& b, Windows& before) {
    [&]<int... Step>(std::integer_sequence<int, Step...>) { (scan_step<Step>(a, b, before), ...); }(
        std::make_integer_sequence<int, kScanSteps>());
  }

  // A window's state from zero rounds independently of its neighbours', so b composes with the
  // product's value alone; the product keeps its error for the carry.
  template <int Step>
  static void scan_step(Coeffs& a, V& b, Windows& before) {
    constexpr int kShift = 1 << Step;
    constexpr auto kLaneIndices = std::make_index_sequence<W>();
    const Coeffs a_before = before.coeff[Step];
    const V b_before = before.state[Step];
    before.coeff[Step] = a;
    before.state[Step] = b;
    b = multiply_add(a.value, shift_lanes<O, kShift>(b, b_before, kLaneIndices), b);
    // The first step multiplies the coefficients themselves, which are exact: no errors to carry.
    if constexpr (Step == 0) a = Coeffs::of_exact(a.value, shift_lanes<O, kShift>(a.value, a_before.value, kLaneIndices));
    else
      a = a.times({shift_lanes<O, kShift>(a.value, a_before.value, kLaneIndices),
                   shift_lanes<O, kShift>(a.error, a_before.error, kLaneIndices)});
  }

  // Composes the vector's windows (a, b) after the span's map, lane by lane: lane kLast's window is
  // the vector's own W steps, so lane kLast of the map is the span's map so far. The span's first
  // vector is its map (composing with the identity would turn an infinite a into NaN, by a * 0).
  static void compose_map(const Coeffs& a, const V& b, Coeffs& map_coeff, V& map_state, bool first_vector) {
    map_state = first_vector ? b : a.apply(map_state, b);
    map_coeff = first_vector ? a : a.times(map_coeff);
  }

  // Lane kLast of a span's map.
  static Map last_lane(const Coeffs& map_coeff, const V& map_state, A last, bool nonfinite) {
    return {map_coeff.value[kLast], map_coeff.error[kLast], map_state[kLast], last, nonfinite};
  }

  // Calls vector.template operator()<Full, Unit>(j) for the vectors of span [lo, hi): the first and
  // last as generic (partial, touching the sequence's ends), those between as full, with Unit when
  // every operand in `units` steps by 1. Inner vectors return whether to go on; false ends the span
  // there, and for_each_vector returns false.
  template <typename Vector>
  static bool for_each_vector(int64_t lo, int64_t hi, bool units, const Vector& vector) {
    const int64_t vectors = (hi - lo + W - 1) / W;
    if (vectors == 0) return true;
    vector.template operator()<false, false>(int64_t(0));
    if (units) {
      for (int64_t j = 1; j < vectors - 1; ++j)
        if (!vector.template operator()<true, true>(j)) return false;
    } else {
      for (int64_t j = 1; j < vectors - 1; ++j)
        if (!vector.template operator()<true, false>(j)) return false;
    }
    if (vectors > 1) vector.template operator()<false, false>(vectors - 1);
    return true;
  }

  // After the window scan of vector j: whether an uncompensated pass goes on. Inner vectors carry by
  // products of W coefficients each; the first and last, whose windows reach past the span, carry
  // once each and compound nothing.
  // InfiniteSteps carry by products of +-1 or NaN, exact: nothing to watch.
  template <bool Full, typename Steps>
  static bool carry_within_bound(CarryWatch<V>& watch, const Coeffs& a, int64_t j) {
    if constexpr (!kWatched || !Full || !std::is_same_v<Steps, LoopSteps>) return true;
    watch.note(a.value);
    return j % kCarryWatchPeriod != 0 || !watch.exceeded();
  }

  // The forward recurrence over span [lo, hi) of one sequence, entered with `state` (`fresh`: no
  // state: the span is the sequence's start and has no initial state, so its first element is its
  // input and its coefficient takes no part).
  template <Pass P, typename Steps = LoopSteps>
  static std::optional<Map> forward(Row<const T*> inputs, Row<const C*> coeffs, T* outputs, int64_t lo, int64_t hi,
                                    A state, bool fresh) {
    V out = splat<V>(state), map_state{};
    Coeffs map_coeff = identity_product();
    Windows before;
    NonfiniteWitness<T, V> written;
    CarryWatch<V> watch;
    const bool whole = for_each_vector(lo, hi, inputs.unit && coeffs.unit, [&]<bool Full, bool Unit>(int64_t j) {
      const Lanes lanes = Full ? Lanes::whole(lo, hi, j) : Lanes::of(lo, hi, j);
      V b = load_row<Full, Unit>(inputs, lanes, A(0));
      V coeff = coefficient(load_row<Full, Unit>(coeffs, lanes, kIdentityCoeff));
      if (!Full && fresh && j == 0) coeff = with_lane(coeff, first_lane(lanes), A(0));
      Steps::transform(coeff, b);
      Coeffs a = exact(coeff);
      scan_windows(a, b, before);
      if (!carry_within_bound<Full, Steps>(watch, a, j)) return false;
      if constexpr ((P & kScan) != 0) {
        out = a.apply(out, b);
        store_row<Full>(outputs, out, lanes);
        written.note_each(out);
      }
      if constexpr ((P & kMap) != 0) compose_map(a, b, map_coeff, map_state, !Full && j == 0);
      return true;
    });
    if (!whole || (kWatched && watch.exceeded())) return std::nullopt;
    written.note_last(out);
    return last_lane(map_coeff, map_state, A(0), written.found());
  }

  // The gradient recurrence over span [lo, hi), in this struct's order O (against the forward's),
  // of the sequence [sequence_lo, sequence_hi): d[t] = coeff(t') * d[t'] + d_outputs[t], t' the
  // element the forward scanned after t; d_inputs[t] = d[t], d_coeffs[t] = d[t] * outputs[t''] (t''
  // the element it scanned before t; the initial state, or no gradient, at the sequence's start),
  // times coeff(t) with log coefficients. `state` and `fresh` as for forward().
  template <Pass P, typename Steps = LoopSteps>
  static std::optional<Map> backward(Row<const T*> d_outputs, Row<const C*> coeffs, Row<const T*> outputs, T* d_inputs, C* d_coeffs,
                      int64_t sequence_lo, int64_t sequence_hi, int64_t lo, int64_t hi, const C* initial, A state,
                      bool fresh) {
    // Memory offset of the element the forward scanned after a given one (its coefficient multiplies
    // this element's gradient), and the forward's first element of the sequence.
    constexpr int64_t kForwardNext = O == Order::Ascending ? -1 : 1;
    const int64_t forward_first = O == Order::Ascending ? sequence_hi - 1 : sequence_lo;
    const A initial_state = initial != nullptr ? static_cast<A>(*initial) : A(0);
    V d = splat<V>(state), map_state{};
    Coeffs map_coeff = identity_product();
    Windows before;
    NonfiniteWitness<T, V> written;
    CarryWatch<V> watch;
    A last = A(0);
    const int64_t vectors = (hi - lo + W - 1) / W;
    const bool whole = for_each_vector(lo, hi, d_outputs.unit && coeffs.unit, [&]<bool Full, bool Unit>(int64_t j) {
      const Lanes lanes = Full ? Lanes::whole(lo, hi, j) : Lanes::of(lo, hi, j);
      // Inner vectors' neighbours fall in the sequence: only the first and last can reach past it.
      V b = load_row<Full, Unit>(d_outputs, lanes, A(0));
      V next_coeff, previous, own_coeff;  // coeffs one step later, outputs one step earlier, in the forward's order
      if constexpr (Full) {  // inner vectors' neighbours fall in the sequence
        next_coeff = coefficient(load_row<Full, Unit>(coeffs, lanes.shifted(kForwardNext, sequence_lo, sequence_hi), kIdentityCoeff));
        previous = load_row<Full, true>(outputs, lanes.shifted(-kForwardNext, sequence_lo, sequence_hi), A(0));
        if constexpr (LogCoeffs) own_coeff = coefficient(load_row<Full, Unit>(coeffs, lanes, kIdentityCoeff));
      } else {
        // Near the sequence's ends: the vector's own lanes shifted by one, and the element beyond
        // them; the initial state before the forward's first step (in pad lanes or beyond).
        constexpr auto kLaneIndices = std::make_index_sequence<W>();
        const int64_t next_beyond = O == Order::Ascending ? lanes.base - 1 : lanes.base + W;
        const int64_t previous_beyond = O == Order::Ascending ? lanes.base + W : lanes.base - 1;
        own_coeff = coefficient(load_row<false, Unit>(coeffs, lanes, kIdentityCoeff));
        next_coeff = shift_lanes<O, 1>(own_coeff, coefficient(splat<V>(element(coeffs, next_beyond, sequence_lo, sequence_hi, kIdentityCoeff))),
                              kLaneIndices);
        previous = shift_lanes<opposite(O), 1>(load_row<false, true>(outputs, lanes, initial_state),
                                               splat<V>(element(outputs, previous_beyond, sequence_lo, sequence_hi, initial_state)),
                                               kLaneIndices);
      }
      if (!Full && fresh && j == 0) next_coeff = with_lane(next_coeff, first_lane(lanes), A(0));
      Steps::transform(next_coeff, b);
      Coeffs a = exact(next_coeff);
      scan_windows(a, b, before);
      if (!carry_within_bound<Full, Steps>(watch, a, j)) return false;
      if constexpr ((P & kScan) != 0) {
        d = a.apply(d, b);
        store_row<Full>(d_inputs, d, lanes);
        written.note_each(d);
        V d_coeff = d * previous;
        if constexpr (LogCoeffs) d_coeff = d_coeff * own_coeff;
        if constexpr (!Full) {
          const int64_t start_lane = forward_first - lanes.base;
          if (initial == nullptr && start_lane >= lanes.first && start_lane < lanes.first + lanes.count)
            d_coeff = with_lane(d_coeff, static_cast<int>(start_lane), A(0));  // no part without an initial state
          if (j == vectors - 1) last = d[O == Order::Ascending ? lanes.first + lanes.count - 1 : lanes.first];
        }
        store_row<Full>(d_coeffs, d_coeff, lanes);
      }
      if constexpr ((P & kMap) != 0) compose_map(a, b, map_coeff, map_state, !Full && j == 0);
      return true;
    });
    if (!whole || (kWatched && watch.exceeded())) return std::nullopt;
    written.note_last(d);
    return last_lane(map_coeff, map_state, last, written.found());
  }
};

// The kernels of one element type T, coefficient type C, vector width, scan order and coefficient
// encoding. Coefficients whose products need compensation (kCompensated, numeric.h: float32, alone or
// beside 16-bit inputs) are scanned without it first, and again with it where a span's carried
// products exceed kCarryBound. Outputs are written by the pass that completes.
template <typename T, typename C, int Bytes, Order O, bool LogCoeffs>
struct RowScan : RowScanPass<T, C, Bytes, O, LogCoeffs, false> {
  using Fast = RowScanPass<T, C, Bytes, O, LogCoeffs, false>;
  using Exact = RowScanPass<T, C, Bytes, O, LogCoeffs, kCompensated<C>>;
  using Map = typename Fast::Map;

  template <typename Pointer>
  using Row = RowOperand<Pointer>;
  using A = typename Fast::A;

  template <Pass P>
  static Map forward(Row<const T*> inputs, Row<const C*> coeffs, T* outputs, int64_t lo, int64_t hi, A state, bool fresh) {
    if (const std::optional<Map> map = Fast::template forward<P>(inputs, coeffs, outputs, lo, hi, state, fresh))
      return *map;
    return *Exact::template forward<P>(inputs, coeffs, outputs, lo, hi, state, fresh);
  }
  template <Pass P>
  static Map backward(Row<const T*> d_outputs, Row<const C*> coeffs, Row<const T*> outputs, T* d_inputs, C* d_coeffs,
                      int64_t sequence_lo, int64_t sequence_hi, int64_t lo, int64_t hi, const C* initial, A state,
                      bool fresh) {
    if (const std::optional<Map> map = Fast::template backward<P>(d_outputs, coeffs, outputs, d_inputs, d_coeffs,
                                                                  sequence_lo, sequence_hi, lo, hi, initial, state, fresh))
      return *map;
    return *Exact::template backward<P>(d_outputs, coeffs, outputs, d_inputs, d_coeffs, sequence_lo, sequence_hi, lo,
                                        hi, initial, state, fresh);
  }
};

}  // namespace linrec::cpu
