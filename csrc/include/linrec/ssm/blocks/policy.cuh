// The fused selective scan on the GPU for the calls the lane family (ssm/lanes/) does not
// take: B or C fixed, n above 64, float64, a complex A. The state type S is real or complex; the
// per-step values (u, delta, z, out and their gradients) are real, R. One block per (batch row,
// channel) walks time in chunks of kChunk steps (its kThreads threads hold kItems consecutive steps
// each) and, for every state dim j, scans the chunk with the block-scan primitive (block_scan.h), the
// state before the chunk carried in shared memory. u, delta, z and out move between memory and registers once per chunk; B and C once
// per state dim, shared by the channels through the caches. Only the state before every chunk goes
// to memory (checkpoints), and the last state of every sequence.
//
// The backward walks the chunks from last to first: it recomputes a chunk's states from its
// checkpoint, scans the adjoint backwards (g_t = dy_t * C_t + exp(dt_{t+1} * A) * g_{t+1}, with
// the conjugates of C and the decay for a complex state) with the same primitive, the adjoint after
// the chunk carried in shared memory, and forms every gradient from the two. The shared gradients are reduced without atomics where they are per channel (A, D,
// delta_bias, fixed B and C: per-warp sums in shared memory, then per-row partials that the op layer
// adds up over the batch); varying B and C, shared by the channels of a group, are added up across
// blocks with atomic adds, through shared memory so that a warp's fall on consecutive addresses.
//
// Packed sequences (and each unpacked row) restart the state at their first step: its coefficient
// becomes 0 and its value exp(dt * A) * initial + dt * B * u, as in the linrec kernels
// (sequence_starts.h); a sequence's gradient stops there too.
//
// This header: the block family's policies.
#pragma once

#include "linrec/ssm/params.h"

namespace linrec::ssm {

// MinBlocks: blocks an SM is to hold at least (__launch_bounds__), which caps the registers a thread takes.
template <int Threads, int Items, int MinBlocks = 1>
struct Policy {
  static constexpr int kThreads = Threads;
  static constexpr int kItems = Items;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kWarps = Threads / 32;
  static constexpr int kTile = Threads * Items;
  static_assert(kTile == kChunk, "a block's tile is a checkpoint chunk");
};

// A tile is a checkpoint chunk (kChunk = 512 steps): two warps of 8 steps a thread. The scan's
// barriers order each chunk's shared carry between them; a block of one warp has none.
using ForwardPolicy = Policy<64, 8>;
using BackwardPolicy = Policy<64, 8>;

}  // namespace linrec::ssm
