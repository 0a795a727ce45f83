// The bulk family's policy: the tile a block scans (a box of channels x time steps, copied into
// shared memory by the copy unit), the ring of boxes a block keeps in flight, the element types and
// variants compiled, and occupancy. Rules here; the measurements behind them are in docs/design.md
// (Bulk-copied strided time).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "linrec/numeric.h"
#include "linrec/plan.h"

namespace linrec::cuda::bulk {

// A compiled configuration: the scan direction of the forward op. Every call of the family takes the
// same box shape for its element types.
struct BulkConfig {
  bool reverse;
  constexpr bool operator==(const BulkConfig&) const = default;
};

inline std::string describe(const BulkConfig& config) {
  return "{bulk, reverse=" + std::to_string(config.reverse) + "}";
}

// BulkConfig as a type, for the kernels' template lists (nvcc's host stubs reject class-type
// template arguments on __global__ functions).
template <BulkConfig Config>
struct Policy {
  static constexpr BulkConfig config = Config;
};

// A block is 4 warps; a warp's 32 lanes take 32 neighbouring channels (one recurrence each, float or
// wider state) and the warps split the chunk's time steps, kItems consecutive steps a thread. The box
// of a chunk is those 32 channels by kChunk steps. The kernels issue about a thousand instructions a
// warp per chunk beside the items' own (the chunk's bookkeeping, the scan across warps, the look-back),
// so a thread takes many steps: 32 of float states, 16 of complex64's.
constexpr int kWarp = 32;
constexpr int kChannels = kWarp;
constexpr int kWarps = 4;
constexpr int kThreads = kWarp * kWarps;

template <typename T>
constexpr int kItems = sizeof(accumulator_t<T>) <= 4 ? 32 : 16;
template <typename T>
constexpr int kChunk = kWarps * kItems<T>;

// Box slots in shared memory start on 128-byte boundaries (the copy unit's alignment).
constexpr int64_t aligned_slot(int64_t bytes) { return (bytes + 127) / 128 * 128; }

// The boxes of one chunk, a stage of the ring. Forward: inputs and coefficients. Backward: the
// upstream gradient, and coefficients and outputs with one step more, on the side where the
// backward's recurrence reads its neighbour (the next coefficient, the previous output).
template <typename T, typename C, bool Backward>
struct StageLayout {
  static constexpr int64_t kFirstRows = kChunk<T>;
  static constexpr int64_t kOtherRows = kChunk<T> + (Backward ? 1 : 0);
  static constexpr int64_t kFirstBytes = aligned_slot(kFirstRows * kChannels * sizeof(T));    // inputs, d_outputs
  static constexpr int64_t kCoeffBytes = aligned_slot(kOtherRows * kChannels * sizeof(C));    // coefficients
  static constexpr int64_t kOutputBytes = Backward ? aligned_slot(kOtherRows * kChannels * sizeof(T)) : 0;
  static constexpr int64_t kBytes = kFirstBytes + kCoeffBytes + kOutputBytes;
  // Bytes the copy unit writes into a stage: the boxes without their slots' padding.
  static constexpr uint32_t kCopiedBytes = static_cast<uint32_t>(
      (kFirstRows * sizeof(T) + kOtherRows * sizeof(C) + (Backward ? kOtherRows * sizeof(T) : 0)) * kChannels);
};

// The ring: as many stages as fit in 48 KB, 2 to 4. A block issues a stage's copies as soon as the
// chunk before in that stage is stored, so up to kStages - 1 chunks load while it scans one and waits
// on the look-back.
constexpr int64_t kRingBytes = 48 * 1024;
template <typename T, typename C, bool Backward>
constexpr int kStages = [] {
  const int64_t fit = kRingBytes / StageLayout<T, C, Backward>::kBytes;
  return static_cast<int>(fit < 2 ? 2 : fit > 4 ? 4 : fit);
}();

template <typename T, typename C, bool Backward>
constexpr int64_t ring_bytes() {
  return kStages<T, C, Backward> * StageLayout<T, C, Backward>::kBytes;
}

// Blocks an SM the kernels are compiled for, so that some scan and store while others wait on their
// look-back: float states 4 forward (128 registers a thread) and 3 backward (170); complex64 half that.
template <typename T, bool Backward>
constexpr int kMinBlocks = (Backward ? 3 : 4) / (std::is_same_v<accumulator_t<T>, float> ? 1 : 2);

// float32 and complex64 take the family below this many tiles of 32 channels per SM, where the pipe
// family would chain their chunks across blocks; above it, the strided pipes (a block walking a
// tile's whole sequences, no look-back) are faster for them. 16-bit types take it whatever the count
// (docs/design.md, Bulk-copied strided time).
constexpr int kWideTilesPerMultiprocessor = 2;

template <typename T>
bool takes(int64_t tiles, int multiprocessors) {
  return sizeof(T) == 2 || tiles < static_cast<int64_t>(kWideTilesPerMultiprocessor) * multiprocessors;
}

// The element types of inputs (T) and coefficients (C) the family is compiled for: the 16-bit types
// (coefficients of the same type or float32), float32 and complex64.
template <typename T, typename C>
constexpr bool compiled_for() {
  constexpr bool sixteen_bit = sizeof(T) == 2 && !std::is_same_v<T, float> &&
                               (std::is_same_v<C, T> || std::is_same_v<C, float>);
  return sixteen_bit || (std::is_same_v<T, float> && std::is_same_v<C, float>) ||
         (std::is_same_v<T, Complex<float>> && std::is_same_v<C, Complex<float>>);
}

}  // namespace linrec::cuda::bulk
