// The fused selective scan's parameters: plain structs handed from the op layer (ssm/ops.h) to the
// CPU loop (ssm/sequential.h) and the CUDA kernels (ssm/lanes/, ssm/blocks/). Torch-free.
//
// Layouts (every tensor contiguous, time last):
//   u, delta, z, out, and their gradients: (batch, d, length), element type T;
//   A (d, n), D and delta_bias (d,), initial and last_state (sequences, d, n): the state type S
//   (float32, or float64 beside float64 T);
//   B and C: fixed (d, n) in S, or varying (batch, groups, n, length) in T or S, channel k reading
//   group k / (d / groups);
//   checkpoints: (batch, d, chunks, n) in S, the state before each chunk of kChunk steps.
#pragma once

#include <cstdint>

#include "linrec/params.h"

namespace linrec::ssm {

// Time steps between the states the forward saves for the backward, which recomputes the states
// inside a chunk from the one before it. Both devices use it: it sets the checkpoints' shape.
constexpr int64_t kChunk = 512;

LINREC_HOST_DEVICE int64_t chunks_of(int64_t length) { return (length + kChunk - 1) / kChunk; }

// B or C.
struct Projection {
  const void* data = nullptr;
  bool varying = false;  // (batch, groups, n, length); else fixed (d, n)
  bool wide = false;     // varying, stored in the state type S rather than T
  int64_t groups = 1;

  // The first element of channel k's (batch row b's) values of state dim j: a fixed one's value, or
  // the start of a varying one's time row.
  LINREC_HOST_DEVICE int64_t offset(int64_t b, int64_t k, int64_t j, int64_t d, int64_t n, int64_t length) const {
    if (!varying) return k * n + j;
    return ((b * groups + k / (d / groups)) * n + j) * length;
  }
};

// Packed sequences along time (batch 1), or one sequence per row.
struct Sequences {
  const void* cu_seqlens = nullptr;  // int32 or int64 offsets [0, ..., length]; null: unpacked
  bool offsets_int64 = false;
  int64_t count = 0;                 // sequences: rows of initial and last_state
  int64_t length = 0;                // of the time dim
  // Unpacked rows' state rows (a decode step's cache of states, selective_state_update): int32 or
  // int64 (batch,); null: batch row b's is row b.
  const void* state_rows = nullptr;
  bool state_rows_int64 = false;

  // The row of initial and last_state that unpacked batch row b starts from and ends in: b, or its
  // entry of state_rows; -1 for none (a padded batch row: a negative entry, or one past the rows),
  // which starts from zeros and whose last state is not written.
  LINREC_HOST_DEVICE int64_t state_row(int64_t b) const {
    if (state_rows == nullptr) return b;
    const int64_t row = state_rows_int64 ? static_cast<const int64_t*>(state_rows)[b]
                                         : static_cast<const int32_t*>(state_rows)[b];
    return row >= 0 && row < count ? row : -1;
  }

  // Offset s, clamped to [0, length]: the API checks the offsets' values in eager mode, and a traced
  // call's offsets must not lead the kernels out of their rows.
  LINREC_HOST_DEVICE int64_t boundary(int64_t s) const {
    const int64_t value =
        offsets_int64 ? static_cast<const int64_t*>(cu_seqlens)[s] : static_cast<const int32_t*>(cu_seqlens)[s];
    return value < 0 ? 0 : value > length ? length : value;
  }

  LINREC_HOST_DEVICE bool packed() const { return cu_seqlens != nullptr; }

  // Whether sequence s has no steps (rows count as sequences when unpacked).
  LINREC_HOST_DEVICE bool empty(int64_t s) const { return packed() ? boundary(s) == boundary(s + 1) : length == 0; }

  // The packed sequence holding step t: the last one starting at or before it (skipping the empty
  // ones that start there too).
  LINREC_HOST_DEVICE int64_t sequence_at(int64_t t) const {
    int64_t low = 0, high = count;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (boundary(middle) <= t) low = middle;
      else high = middle;
    }
    return low;
  }

  // The packed sequence holding step t, walking forward from sequence s (one starting at or before t),
  // or backward from s (one holding a later step).
  LINREC_HOST_DEVICE int64_t forward_to(int64_t s, int64_t t) const {
    while (s + 1 < count && boundary(s + 1) <= t) ++s;
    return s;
  }
  LINREC_HOST_DEVICE int64_t backward_to(int64_t s, int64_t t) const {
    while (s > 0 && boundary(s) > t) --s;
    return s;
  }

  // Calls visit(s) for the sequences without steps whose state batch row b's tasks set: every packed
  // one (packed sequences have batch 1), or the row's own when the length is 0.
  template <typename Visit>
  LINREC_HOST_DEVICE void for_each_empty(int64_t b, Visit&& visit) const {
    const int64_t first = packed() ? 0 : b, last = packed() ? count : b + 1;
    for (int64_t s = first; s < last; ++s)
      if (empty(s)) visit(s);
  }
};

// The lane kernels' policies (ssm/lanes/policy.cuh: with_policy): one state dim a lane and sixteen lanes
// a channel (Single), lanes sized to n in blocks of four warps (Narrow) or, in the forward above n = 16,
// of eight (Wide).
enum class LanePolicy : int8_t { Single, Narrow, Wide };

// The GPU's kernel families of the fused scan: the lane kernels (ssm/lanes/: Mamba's operands) or the
// block kernels (ssm/blocks/: the other calls).
enum class Family : int8_t { Lanes, Blocks };

// How a call runs on the GPU: its kernel family; the lane kernels' policy; its rows split along time into
// `segments` of `segment_chunks` chunks; in a deterministic backward, the blocks of channels whose varying
// B and C gradient terms are kept apart and summed in a fixed order (0: added across blocks atomically);
// and the zeroed workspace that takes (bytes, 16-byte aligned).
struct Plan {
  Family family = Family::Blocks;
  LanePolicy lane_policy = LanePolicy::Narrow;
  int64_t segments = 1, segment_chunks = 0;
  int64_t channel_blocks = 0;
  int64_t workspace_bytes = 0;
};

struct ForwardParams {
  DType dtype = DType::Float32;  // T
  DType state_dtype = DType::Float32;  // S
  int64_t batch = 0, d = 0, n = 0, length = 0;
  const void* u = nullptr;
  const void* delta = nullptr;
  const void* z = nullptr;           // optional
  const void* A = nullptr;
  Projection B, C;
  const void* D = nullptr;           // optional
  const void* delta_bias = nullptr;  // optional
  bool delta_softplus = false;
  // Every time row (of u, delta, z, out, varying B and C, and the backward's) starts 16-byte aligned,
  // so that the CUDA kernels move them in 16-byte accesses.
  bool vectorized = false;
  const void* initial = nullptr;     // optional
  Sequences sequences;
  // Rows split along time (ssm::Plan): segments of segment_chunks chunks, scanned side by side, with
  // the plan's workspace.
  int64_t segments = 1, segment_chunks = 0;
  void* workspace = nullptr;
  void* out = nullptr;
  void* checkpoints = nullptr;       // null: not kept (a decode step)
  void* last_state = nullptr;        // an empty sequence's is its initial state (zeros without one)
};

// A decode step (selective_state_update): a forward of length 1 whose initial and last_state are one
// (slots, d, n) tensor of states, updated in place (the kernels read a state before they write it, in the
// same thread), sequences.state_rows picking each batch row's, and no checkpoints. Its own type so
// that the GPU plans and launches it as a step (ssm/step_kernels.cuh).
struct StateUpdateParams : ForwardParams {};

// The backward's inputs are the forward's, its upstream gradients and checkpoints. Outputs: d_u,
// d_delta and d_z per element; the gradients of the shared operands as partial sums that the op
// layer adds up: d_A, and fixed d_B / d_C, per batch row (batch, d, n); d_D and d_delta_bias per batch
// row (batch, d); varying d_B / d_C summed over channels in S, zeroed beforehand.
struct BackwardParams : ForwardParams {
  const void* d_out = nullptr;
  const void* d_last_state = nullptr;  // optional, (sequences, d, n) in S
  const void* saved_checkpoints = nullptr;  // the forward's checkpoints
  void* d_u = nullptr;
  void* d_delta = nullptr;
  void* d_z = nullptr;                 // when z is given
  void* d_A = nullptr;
  void* d_B = nullptr;
  void* d_C = nullptr;
  void* d_D = nullptr;                 // when D is given
  void* d_delta_bias = nullptr;        // when delta_bias is given
  void* d_initial = nullptr;           // when initial is given, (sequences, d, n) in S
  // The same gradients on every run: varying B's and C's terms summed in a fixed order (ssm::Plan's
  // channel_blocks), not with atomic adds.
  bool deterministic = false;
  int64_t channel_blocks = 0;
};

}  // namespace linrec::ssm
