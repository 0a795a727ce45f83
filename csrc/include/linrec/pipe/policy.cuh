// The pipe family's policy: its tile shapes, the configs compiled from them, which configs each pair
// of element types and each backward variant is compiled for, occupancy caps and the thresholds the
// plan (plan.cuh) chooses by. Rules here; the measurements behind them are in docs/design.md.
#pragma once

#include <array>
#include <string>
#include <type_traits>

#include "linrec/memio.h"
#include "linrec/numeric.h"
#include "linrec/plan.h"

namespace linrec {

// A compiled kernel configuration. Items per thread = vectors_per_thread 16-byte vectors: of T for
// pipes over time-contiguous rows, of the accumulator type for the chained and strided kernels (the
// same register budget for every dtype, which a 16-bit tile held as floats would exceed).
// For Strided, threads_per_sequence is the warps a block spreads each sequence over, one lane each.
struct PipeConfig {
  int threads_per_sequence;
  int vectors_per_thread;
  bool reverse;
  Access access;  // Vectorized and Coalesced need 16-byte aligned rows and pointers; Staged takes any alignment
  bool broadcast = false;  // an operand it reads is broadcast along time (time stride 0); Staged only
  Schedule schedule = Schedule::Pipe;
  constexpr bool operator==(const PipeConfig&) const = default;
};

inline std::string describe(const PipeConfig& config) {
  return "{threads_per_sequence=" + std::to_string(config.threads_per_sequence) +
         ", vectors_per_thread=" + std::to_string(config.vectors_per_thread) +
         ", reverse=" + std::to_string(config.reverse) + ", access=" + access_name(config.access) +
         ", broadcast=" + std::to_string(config.broadcast) +
         ", schedule=" + (config.schedule == Schedule::Pipe ? "pipe" : "chained") + "}";
}

}  // namespace linrec

namespace linrec::cuda::pipe {

// The tile shapes (threads per sequence, 16-byte vectors per thread) of tile_shapes.inc.
#define LINREC_PIPE_ROW_TILE(threads, vectors) std::array<int, 2>{threads, vectors},
#define LINREC_PIPE_CHAINED_TILE(threads, vectors)
#define LINREC_PIPE_STRIDED_TILE(threads, vectors)
// Row tiles, smallest first. Up to 32 threads a sequence is one warp or less, several sequences packed
// into a block; 64 threads, a block per sequence. Larger tiles are not compiled: the tuning sweep
// (python -m linrec.tune) finds none faster than 64 x 2 (docs/design.md, Kernel configurations).
constexpr std::array kTileShapes{
#include "linrec/pipe/tile_shapes.inc"
};
#undef LINREC_PIPE_ROW_TILE
#undef LINREC_PIPE_CHAINED_TILE
#define LINREC_PIPE_ROW_TILE(threads, vectors)
#define LINREC_PIPE_CHAINED_TILE(threads, vectors) threads, vectors

// Operands broadcast along time (one coefficient per row, or an expanded gradient) are rare enough
// for one tile shape: the largest, Staged, whatever the length.
constexpr std::array<int, 2> kBroadcastTileShape = kTileShapes.back();

// A chained chunk is one tile of a whole block: many items a thread, so that the look-back's latency
// is paid for many elements, in blocks of 4 warps, 6 to an SM rather than 8 warps, 3 to an SM, so that
// more blocks load while others look back (figures in docs/design.md, Chained look-back).
constexpr std::array<int, 2> kChainedTileShape{
#include "linrec/pipe/tile_shapes.inc"
};
#undef LINREC_PIPE_CHAINED_TILE
#undef LINREC_PIPE_STRIDED_TILE
#define LINREC_PIPE_CHAINED_TILE(threads, vectors)
#define LINREC_PIPE_STRIDED_TILE(threads, vectors) threads, vectors

// Strided time: 8 warps x 32 channels per block, 4 accumulator vectors (16 float32 items) per thread.
constexpr std::array<int, 2> kStridedTileShape{
#include "linrec/pipe/tile_shapes.inc"
};
#undef LINREC_PIPE_ROW_TILE
#undef LINREC_PIPE_CHAINED_TILE
#undef LINREC_PIPE_STRIDED_TILE

constexpr auto kPipeConfigs = [] {
  std::array<PipeConfig, kTileShapes.size() * 4 + 2 + 6 + 4> configs{};
  int n = 0;
  for (bool reverse : {false, true}) {
    for (const auto& [threads, vectors] : kTileShapes)
      for (Access access : {Access::Vectorized, Access::Staged}) configs[n++] = PipeConfig{threads, vectors, reverse, access};
    configs[n++] = PipeConfig{kBroadcastTileShape[0], kBroadcastTileShape[1], reverse, Access::Staged, true};
    for (Access access : {Access::Vectorized, Access::Coalesced, Access::Staged})
      configs[n++] = PipeConfig{kChainedTileShape[0], kChainedTileShape[1], reverse, access, false, Schedule::Chained};
    for (Schedule schedule : {Schedule::Pipe, Schedule::Chained})
      configs[n++] = PipeConfig{kStridedTileShape[0], kStridedTileShape[1], reverse, Access::Strided, false, schedule};
  }
  return configs;
}();

// Chained aligned rows move their tiles Coalesced for 4-byte and wider types, Vectorized for 16-bit
// ones: a chained block loads its tile once and then waits, so fetching each sector once pays for the
// shared-memory regrouping of a tile of 4-byte elements, not of a 16-bit tile, half the bytes for the
// same round trip and barriers (docs/design.md, Memory access).
template <typename T>
constexpr Access kChainedAlignedAccess = sizeof(T) >= sizeof(float) ? Access::Coalesced : Access::Vectorized;

// Whether the kernels of `config` (the backward's in `variant`) are compiled for inputs of T and
// coefficients of C: all configs but the chained aligned access of the other types; for channel pairs,
// the strided pipe. The Packed and Summing backward variants, and mixed precision (C float beside
// 16-bit T), take one row tile of the pipes over time-contiguous rows, the largest: every variant of
// every tile shape in every dtype multiplies the device code, which the release wheel holds for six GPU
// architectures (docs/design.md, Code size). Short packed rows, short rows that share their
// coefficients, and short mixed rows run that tile.
template <typename T, typename C>
constexpr bool compiled_for(const PipeConfig& config, Variant variant = Variant::Plain) {
  if (is_channel_pair<T>::value) return config.access == Access::Strided && config.schedule == Schedule::Pipe;
  const bool chained_aligned = config.schedule == Schedule::Chained &&
                               (config.access == Access::Vectorized || config.access == Access::Coalesced);
  if (chained_aligned && config.access != kChainedAlignedAccess<T>) return false;
  const bool small_row_tile = config.schedule == Schedule::Pipe && config.access != Access::Strided &&
                              !config.broadcast &&
                              (config.threads_per_sequence != kTileShapes.back()[0] ||
                               config.vectors_per_thread != kTileShapes.back()[1]);
  return (variant == Variant::Plain && std::is_same_v<T, C>) || !small_row_tile;
}

// Below these counts of sequences (time-contiguous) or 32-channel groups (strided) per SM, the
// GPU is not kept busy by one segment per sequence, and sequences are chained across blocks; above
// them the pipes, which carry the output from tile to tile and need no look-back, are the faster
// (figures around the threshold in docs/design.md, Chained look-back).
constexpr int kPipeRowsPerMultiprocessor = 4;
constexpr int kPipeGroupsPerMultiprocessor = 2;

constexpr int kPackedBlockThreads = 128;
constexpr int kWarp = 32;

// PipeConfig as a type, for the kernels' template lists (nvcc's host stubs reject class-type
// template arguments on __global__ functions).
template <PipeConfig Config>
struct Policy {
  static constexpr PipeConfig config = Config;
};

__host__ __device__ constexpr int block_threads(const PipeConfig& config) {
  if (config.access == Access::Strided) return kWarp * config.threads_per_sequence;
  return config.threads_per_sequence < kWarp ? kPackedBlockThreads : config.threads_per_sequence;
}

// Threads of tile-holding forward blocks compiled to fit on an SM at once (registers capped at 85):
// chained and strided blocks hold a whole tile while they wait on memory or the look-back, and need
// other blocks' loads in flight meanwhile. Not for 8- and 16-byte accumulators, whose tiles do not fit
// in that many registers and would spill (docs/design.md, Kernel configurations).
constexpr int kTileHoldingThreadsPerMultiprocessor = 768;

// Coalesced blocks also move the tile through shared memory, and need 102 registers (5 blocks of 128
// threads an SM) not to spill (docs/design.md, Memory access, compares 4, 5 and 6 blocks).
constexpr int kCoalescedTileThreadsPerMultiprocessor = 640;

// The 16-bit pipe forwards over time-contiguous rows do not prefetch and are latency-bound, so
// occupancy sets their speed; left to itself the compiler gives the 32 x 2 and 64 x 2 tiles up to 128
// registers (8 blocks of 64 threads an SM), and fits them in 96 without spilling.
constexpr int kSixteenBitPipeThreadsPerMultiprocessor = 640;

template <typename T>
__host__ __device__ constexpr int min_blocks_forward(const PipeConfig& config) {
  const bool holds_tile = config.access == Access::Strided || config.schedule == Schedule::Chained;
  using Acc = accumulator_t<T>;
  if (!holds_tile && sizeof(T) == 2) return kSixteenBitPipeThreadsPerMultiprocessor / block_threads(config);
  if (!holds_tile || !(std::is_same_v<Acc, float> || std::is_same_v<Acc, ChannelPair<float>>)) return 1;
  const int threads = config.access == Access::Coalesced ? kCoalescedTileThreadsPerMultiprocessor
                                                         : kTileHoldingThreadsPerMultiprocessor;
  return threads / block_threads(config);
}

__host__ __device__ constexpr int sequences_per_block(const PipeConfig& config) {
  return config.access == Access::Strided ? kWarp : block_threads(config) / config.threads_per_sequence;
}

template <typename T>
__host__ __device__ constexpr int items_per_vector() { return 16 / sizeof(T); }

template <typename T>
__host__ __device__ constexpr int items_per_thread(const PipeConfig& config) {
  if (config.access == Access::Strided || config.schedule == Schedule::Chained)
    return config.vectors_per_thread * items_per_vector<accumulator_t<T>>();
  return config.vectors_per_thread * items_per_vector<T>();
}

// Elements of a sequence one tile covers.
template <typename T>
__host__ __device__ constexpr int64_t tile_length(const PipeConfig& config) {
  return static_cast<int64_t>(config.threads_per_sequence) * items_per_thread<T>(config);
}

}  // namespace linrec::cuda::pipe
