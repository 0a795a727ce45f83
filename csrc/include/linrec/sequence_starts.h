// Where the recurrence starts over inside a row: the first element, in the op's direction, of every
// non-empty packed sequence (cu_seqlens), or of the whole row without packing. The parallel kernels
// scan a row of packed sequences as one sequence in which these elements reset the state: their
// coefficient becomes 0 (the coefficient before a sequence takes no part) and the sequence's initial
// state enters there. A tile then costs the same whatever the number of sequences it holds.
#pragma once

#include <cstdint>

#include "linrec/numeric.h"
#include "linrec/params.h"

namespace linrec {

// Packed: the kernel is compiled for packed sequences; without, it takes the layout as unpacked
// whatever its cu_seqlens, and the code for them is left out.
template <bool Packed>
struct SequenceStarts {
  const SequenceLayout& layout;

  // The packed sequence holding element `position` of a row (0 <= position < seq_len): the last
  // segment starting at or before it, which skips the empty ones starting there too. One load per
  // halving of [0, num_segments): the offsets stay in L1, and every lane of a strided warp asks for
  // the same ones.
  LINREC_HOST_DEVICE int64_t segment_at(int64_t position) const {
    int64_t low = 0, high = layout.num_segments;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (layout.boundary(middle) <= position) low = middle;
      else high = middle;
    }
    return low;
  }

  // Calls visit(position, segment) for every start in [begin, end), in increasing position.
  template <typename Visit>
  LINREC_HOST_DEVICE void for_each(int64_t begin, int64_t end, Visit&& visit) const {
    begin = begin < 0 ? 0 : begin;
    end = end > layout.seq_len ? layout.seq_len : end;
    if (begin >= end) return;
    if (!Packed || layout.cu_seqlens == nullptr) {
      const int64_t first = layout.reverse ? layout.seq_len - 1 : 0;
      if (begin <= first && first < end) visit(first, int64_t{0});
      return;
    }
    // Forward: segment s starts at boundary(s); reverse: at boundary(s + 1) - 1. The segment holding
    // `begin` is the first whose start can lie in the range.
    int64_t segment = segment_at(begin);
    int64_t segment_begin = layout.boundary(segment);
    for (; segment < layout.num_segments; ++segment) {
      const int64_t segment_end = layout.boundary(segment + 1);
      const int64_t start = layout.reverse ? segment_end - 1 : segment_begin;
      if (start >= end) break;
      if (start >= begin && segment_end > segment_begin) visit(start, segment);
      segment_begin = segment_end;
    }
  }
};

// The sequence starts among a thread's Items consecutive elements from `begin`, in the forward op's
// recurrence: outputs[start] = coeffs[start] * initial + inputs[start], and the state before a start
// takes no part (its coefficient becomes 0). `initial`: the row's initial states, a packed sequence's
// `initial_stride` apart (null: none). One search per thread's chunk rather than a test per item.
// Returns whether the chunk holds a start (a reset for the scan, block_scan.h).
template <bool Packed, typename Acc, typename C, int Items>
LINREC_HOST_DEVICE bool restart_forward(const SequenceStarts<Packed>& starts, int64_t begin, Acc (&value)[Items],
                                        Acc (&coeff)[Items], const C* initial, int64_t initial_stride) {
  bool resets = false;
  starts.for_each(begin, begin + Items, [&](int64_t position, int64_t segment) {
    resets = true;
    const Acc state = initial != nullptr ? static_cast<Acc>(initial[segment * initial_stride]) : Acc(0);
    LINREC_UNROLL
    for (int i = 0; i < Items; ++i) {
      if (begin + i == position) {
        if (initial != nullptr) value[i] = coeff[i] * state + value[i];
        coeff[i] = Acc(0);  // the state before the start takes no part, whatever it is
      }
    }
  });
  return resets;
}

// The same for the backward recurrence (d_inputs against the forward op's direction): a start has no
// predecessor, so its factor prev_output (conj(outputs[prev])) is its sequence's initial state where
// there is one; the element before it in the forward direction has no successor, so its
// shifted_coeff (conj(coeffs[next])) becomes 0. Returns the starts as bits (bit i: item i starts a
// sequence), for d_coeffs and d_initial, and whether a shifted coefficient became 0 (a reset for the
// scan, block_scan.h).
struct ChunkRestarts {
  uint32_t starts = 0;
  bool resets = false;
};

template <bool ForwardReverse, bool Packed, typename Acc, typename C, int Items>
LINREC_HOST_DEVICE ChunkRestarts restart_backward(const SequenceStarts<Packed>& starts, int64_t begin,
                                                  Acc (&shifted_coeff)[Items], Acc (&prev_output)[Items],
                                                  const C* initial, int64_t initial_stride) {
  static_assert(Items <= 32, "the starts are bits of one word");
  const int64_t window_begin = ForwardReverse ? begin - 1 : begin;
  ChunkRestarts restarts;
  starts.for_each(window_begin, window_begin + Items + 1, [&](int64_t position, int64_t segment) {
    const int64_t at = position - begin, before = ForwardReverse ? at + 1 : at - 1;
    restarts.resets = restarts.resets || (before >= 0 && before < Items);
    LINREC_UNROLL
    for (int i = 0; i < Items; ++i) {
      if (i == at) {
        restarts.starts |= 1u << i;
        if (initial != nullptr) prev_output[i] = conj(static_cast<Acc>(initial[segment * initial_stride]));
      }
      if (i == before) shifted_coeff[i] = Acc(0);
    }
  });
  return restarts;
}

}  // namespace linrec
