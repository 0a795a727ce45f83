// One sequence of the row kernels scanned block by block (row_scan.h: why blocks): on the calling
// thread, or split across PyTorch's intra-op pool when there are fewer sequences than threads.
//
// The split: thread 0 scans the first piece of the sequence while threads 1..P-1 reduce pieces
// 1..P-1 to their blocks' maps (reading two tensors where a scan moves three); the maps then give the
// state entering each piece, and thread k scans piece k + 1. Piece 0 is two thirds of the others, so
// that its scan takes as long as their reductions.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "linrec/cpu/isa.h"
#include "linrec/cpu/row_scan.h"

namespace linrec::cpu {

// The state after a span of map `map`, entered with `state` (`fresh`: with none). The same fused
// multiply-adds on every target, so that the state entering a block does not depend on which thread,
// or pass, composed it.
template <typename A>
inline A apply(const SpanMap<A>& map, A state, bool fresh) {
  if (fresh) return map.state;
  return std::fma(map.coeff, state, map.coeff_error == A(0) ? map.state : std::fma(map.coeff_error, state, map.state));
}

// Span [lo, hi) of memory scanned in `order`, and its blocks in that order.
struct BlockedSpan {
  int64_t lo, hi;
  Order order;

  int64_t blocks() const { return (hi - lo + kBlockLength - 1) / kBlockLength; }

  // Block j's memory range: the j-th kBlockLength steps from the scan's start.
  std::pair<int64_t, int64_t> block(int64_t j) const {
    if (order == Order::Ascending) return {lo + j * kBlockLength, std::min(hi, lo + (j + 1) * kBlockLength)};
    return {std::max(lo, hi - (j + 1) * kBlockLength), hi - j * kBlockLength};
  }
};

// A Job is a BlockedSpan with job.template span<Bytes, Pass>(lo, hi, state, fresh) -> SpanMap<A>
// (one kernel pass over a block) and job.template finish<Bytes>(last) (called after the sequence's
// last block with its output at the last step). Scans blocks [first, last) of the job from `state` and
// returns the state after them; call it inside with_vector_width.
template <int Bytes, typename Job, typename A>
A scan_blocks(const Job& job, int64_t first, int64_t last, A state, bool fresh) {
  const int64_t blocks = job.blocks();
  for (int64_t j = first; j < last; ++j) {
    const auto [lo, hi] = job.block(j);
    if (j + 1 == blocks) {
      job.template finish<Bytes>(job.template span<Bytes, kScan>(lo, hi, state, fresh).last);
    } else {
      state = apply(job.template span<Bytes, kScanAndMap>(lo, hi, state, fresh), state, fresh);
    }
    fresh = false;
  }
  return state;
}

// Scans the whole job on the calling thread.
template <typename Job, typename A>
void scan_sequence(const Job& job, Isa isa, A state, bool fresh) {
  with_vector_width(isa, [&]<int Bytes>() { scan_blocks<Bytes>(job, 0, job.blocks(), state, fresh); });
}

// Scans the whole job on `threads` threads of the pool (the calling thread alone when the job has too
// few blocks for that).
template <typename Job, typename A>
void scan_sequence_split(const Job& job, Isa isa, int64_t threads, A state, bool fresh) {
  const int64_t blocks = job.blocks();
  const int64_t per_piece = 3 * blocks / (3 * threads + 2);
  if (threads < 2 || per_piece < 1) return scan_sequence(job, isa, state, fresh);
  const int64_t first_piece = blocks - threads * per_piece;  // >= 1
  const auto piece_begin = [&](int64_t k) { return k == 0 ? 0 : first_piece + (k - 1) * per_piece; };
  std::vector<SpanMap<A>> maps(blocks);
  std::vector<A> entering(threads + 1);  // the state entering piece k
  torch::stable::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      with_vector_width(isa, [&]<int Bytes>() {
        if (k == 0) {
          entering[1] = scan_blocks<Bytes>(job, 0, first_piece, state, fresh);
          return;
        }
        for (int64_t j = piece_begin(k); j < piece_begin(k + 1); ++j) {
          const auto [lo, hi] = job.block(j);
          maps[j] = job.template span<Bytes, kMap>(lo, hi, A(0), false);
        }
      });
  });
  with_vector_width(isa, [&]<int Bytes>() {
    for (int64_t k = 1; k < threads; ++k) {
      A carried = entering[k];
      for (int64_t j = piece_begin(k); j < piece_begin(k + 1); ++j) carried = apply(maps[j], carried, false);
      entering[k + 1] = carried;
    }
  });
  torch::stable::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      with_vector_width(isa, [&]<int Bytes>() {
        scan_blocks<Bytes>(job, piece_begin(k + 1), piece_begin(k + 2), entering[k + 1], false);
      });
  });
}

}  // namespace linrec::cpu
