// The parallel scan kernels: each sequence is scanned by a segment of ThreadsPerSequence threads,
// tile after tile, carrying the running output between tiles (a pipe; one tile is the tile case).
// Short sequences pack several segments into one 128-thread block. Where there are too few
// sequences to fill the GPU, the tiles of a sequence go to different blocks instead, chained by a
// look-back (lookback.h). Time-contiguous rows are scanned along the row; layouts with time strided
// (channels contiguous) put a warp's lanes on neighbouring channels and split time over its warps.
// Packed sequences (cu_seqlens) are scanned as their row, reset at each sequence's start
// (sequence_starts.h), by the same kernels and configs as unpacked rows.
// Forward and the fused backward share the TileScan primitive (block_scan.h), the chunk loads and
// stores (memio.h) and the two schedules.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <type_traits>
#include <vector>

#include "families.h"
#include "linrec/block_scan.h"
#include "linrec/coeff_gradient_sum.h"
#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"
#include "linrec/lookback.h"
#include "linrec/memio.h"
#include "linrec/nonfinite_rescan.h"
#include "linrec/numeric.h"
#include "linrec/sequence_starts.h"

namespace linrec {

// How a sequence's tiles are distributed: all to one segment that carries the output from tile to
// tile (Pipe), or one tile per block, chained by look-back (Chained).
enum class Schedule : int8_t { Pipe, Chained };

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

namespace cuda {
namespace {

// (threads per sequence, 16-byte vectors per thread), smallest tile first. Up to 32 threads a sequence
// is one warp or less, several sequences packed into a block; 64 threads, a block per sequence. Larger
// tiles are not compiled: the tuning sweep (python -m linrec.tune) finds none faster than 64 x 2
// (docs/design.md, Kernel configurations).
constexpr std::array<std::array<int, 2>, 7> kTileShapes{{{2, 1}, {4, 1}, {8, 1}, {16, 1}, {32, 1}, {32, 2}, {64, 2}}};

// Operands broadcast along time (one coefficient per row, or an expanded gradient) are rare enough
// for one tile shape: the largest, Staged, whatever the length.
constexpr std::array<int, 2> kBroadcastTileShape = kTileShapes.back();

// A chained chunk is one tile of a whole block: many items a thread, so that the look-back's latency
// is paid for many elements, in blocks of 4 warps, 6 to an SM rather than 8 warps, 3 to an SM, so that
// more blocks load while others look back (figures in docs/design.md, Chained look-back).
constexpr std::array<int, 2> kChainedTileShape{128, 4};

// Strided time: 8 warps x 32 channels per block, 4 accumulator vectors (16 float32 items) per thread.
constexpr std::array<int, 2> kStridedTileShape{8, 4};

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
// shared-memory regrouping in float32, but not in bfloat16, where Coalesced measured slower
// (docs/design.md, Memory access). Our reading, not measured directly: a bfloat16 tile (16 items a
// thread, held as floats) is half the bytes of a float32 one, so the shared-memory round trip and its
// barriers weigh twice as much per byte moved.
template <typename T>
constexpr Access kChainedAlignedAccess = sizeof(T) >= sizeof(float) ? Access::Coalesced : Access::Vectorized;

// The backward kernel is compiled in variants, so that the code of features a call does not use takes
// no registers (and occupancy) from it: Plain rows; Packed sequences (cu_seqlens); and Summing the
// coefficient gradient into broadcast coefficients' shape, packed or not. A runtime branch between
// summing and storing in one kernel keeps the registers of both paths live in both. The forward
// kernel is one, packed or not (docs/design.md, Broadcast coefficients and packed sequences).
enum class Variant : int8_t { Plain, Packed, Summing };

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

// Coalesced blocks also move the tile through shared memory and spill at 85 registers; at 102 (5
// blocks of 128 threads an SM) they do not, and 5 blocks an SM measured faster than both 6, which
// spill, and 4 (docs/design.md, Memory access).
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

// Coefficients given as logs (log_coeffs) become the coefficients. Called under one branch per
// tile rather than per item, so that the exponentials are not evaluated when the flag is off.
template <typename Acc, int Items>
__device__ __forceinline__ void exponentiate(Acc (&coeff)[Items]) {
  #pragma unroll
  for (int i = 0; i < Items; ++i) coeff[i] = coefficient(coeff[i], true);
}

// An empty stand-in for the look-back's shared memory in kernels that do not chain.
struct NoStorage {};

// What both pipe kernels share: the thread's sequence and rank in the sequence's segment, the tiles
// it scans (all of its row's, or its block's one chunk), the prefix hook, and the scan and memory
// primitives with their shared memory. ScanReverse is the direction of the scan this kernel runs (the
// backward runs against the forward op's direction). Inputs, outputs and their gradients are of T;
// coefficients, initial states and their gradients of C: T, or float beside 16-bit T (mixed precision),
// whose products are then composed as float32's are.
template <typename T, typename C, PipeConfig Config, bool ScanReverse>
struct PipeThread {
  using Acc = accumulator_t<T>;
  static constexpr bool kStrided = Config.access == Access::Strided;
  static constexpr bool kChained = Config.schedule == Schedule::Chained;
  static constexpr int kItems = items_per_thread<T>(Config);
  static constexpr int kTile = Config.threads_per_sequence * kItems;
  static constexpr int kSequencesPerBlock = sequences_per_block(Config);
  // Whether the pipe loop issues the next tile's loads before scanning the current tile, so that
  // their latency overlaps the scan. It holds a second tile in registers: worth it for 32- and 64-bit
  // types, not for 16-bit ones, whose 16 items a thread in float registers then cost occupancy; nor
  // where a thread's loads are element by element (Strided, where it measured slower) or a block scans
  // one tile (figures in docs/design.md, Kernel configurations).
  static constexpr bool kPrefetch = sizeof(T) >= sizeof(float) && !kStrided && !kChained;
  // A sequence's threads: a run of lanes of one or more warps (time-contiguous rows), or one lane in
  // each of threads_per_sequence warps (strided time).
  static constexpr int kSegmentLanes =
      kStrided ? 1 : (Config.threads_per_sequence < kWarp ? Config.threads_per_sequence : kWarp);
  static constexpr int kSegmentWarps = Config.threads_per_sequence / kSegmentLanes;
  using Scan = TileScan<kSegmentLanes, kSegmentWarps, kItems, ScanReverse, kCompensated<C>>;
  using IO = TileIO<T, Config.threads_per_sequence, block_threads(Config), kItems, Config.access>;
  using CoeffIO = TileIO<C, Config.threads_per_sequence, block_threads(Config), kItems, Config.access>;
  // The look-back's window scan (lookback.h): the first warp, a chunk a lane, for time-contiguous
  // rows; the block arranged like the tile, 4 chunks a thread, for strided time.
  static constexpr int kWindowItems = kStrided ? 4 : 1;
  static constexpr int kLookBackThreads = kStrided ? block_threads(Config) : kWarp;
  using WindowScan = std::conditional_t<kStrided, TileScan<kSegmentLanes, kSegmentWarps, kWindowItems, false, kCompensated<C>>,
                                        TileScan<kWarp, 1, kWindowItems, false, kCompensated<C>>>;
  using Chain = ChainedPrefix<Acc, kChained ? kSequencesPerBlock : 1, WindowScan, kWindowItems, kLookBackThreads>;
  struct Storage {
    typename Scan::template Storage<Acc> scan;
    union {  // the two move their tiles one after the other, each ending on a barrier
      typename IO::Storage io;
      typename CoeffIO::Storage coeff_io;
    };
    std::conditional_t<kChained, typename Chain::Storage, NoStorage> chain;
    bool flagged[kSequencesPerBlock];  // Pipe: the sequences a thread wrote a non-finite result of
    bool last;                         // Chained: whether this block is its group's last to finish
  };

  typename Scan::template Storage<Acc>& scan_storage;
  const int rank;               // within the sequence's segment
  const int sequence_in_block;  // the group of sequences a block scans together
  const int64_t num_tiles;      // per row
  const int64_t num_groups;
  const int64_t chunk;          // Chained: the one tile (scan order) this block scans; Pipe: 0
  const int64_t group;          // the block's group of sequences
  const int64_t sequence;
  const bool active;            // false for threads past the last sequence, which still take part in the
                                // shuffles and barriers, with length 0
  const int64_t length;         // of this thread's row
  const IO io;
  const CoeffIO coeff_io;

  __device__ __forceinline__ PipeThread(Storage& storage_, const SequenceLayout& layout)
      : scan_storage(storage_.scan),
        rank(kStrided ? threadIdx.x / kWarp : threadIdx.x % Config.threads_per_sequence),
        sequence_in_block(kStrided ? threadIdx.x % kWarp : threadIdx.x / Config.threads_per_sequence),
        num_tiles((layout.seq_len + kTile - 1) / kTile),
        num_groups((layout.num_rows() + kSequencesPerBlock - 1) / kSequencesPerBlock),
        chunk(kChained ? blockIdx.x / num_groups : 0),  // chunk-major block order (lookback.h)
        group(kChained ? blockIdx.x % num_groups : blockIdx.x),
        sequence(sequence_of(layout)),
        active(sequence < layout.num_rows()),
        length(active ? layout.seq_len : 0),
        io(storage_.io, rank, sequence_in_block),
        coeff_io(storage_.coeff_io, rank, sequence_in_block) {}

  // This thread's sequence (past the last one for threads without a sequence), from the block and
  // thread indices: for uses after the scan loop, which a `sequence` kept live through it would cost
  // registers.
  __device__ __forceinline__ static int64_t sequence_of(const SequenceLayout& layout) {
    const int64_t groups = (layout.num_rows() + kSequencesPerBlock - 1) / kSequencesPerBlock;
    const int64_t group = kChained ? blockIdx.x % groups : blockIdx.x;
    return group * kSequencesPerBlock + (kStrided ? threadIdx.x % kWarp : threadIdx.x / Config.threads_per_sequence);
  }

  __host__ __device__ static typename Chain::Layout chain_layout(const SequenceLayout& layout) {
    return {(layout.num_rows() + kSequencesPerBlock - 1) / kSequencesPerBlock, (layout.seq_len + kTile - 1) / kTile};
  }

  // The tiles this thread scans, as steps in scan order: [first_step(), end_step()).
  __device__ __forceinline__ int64_t first_step() const { return chunk; }
  __device__ __forceinline__ int64_t end_step() const { return kChained ? chunk + 1 : num_tiles; }

  // The output before each tile: carried along by the segment, or looked back at across blocks.
  __device__ __forceinline__ auto make_prefix(Storage& storage, const SequenceLayout& layout) const {
    if constexpr (kChained) {
      // Strided: the look-back threads are the tile's; rows: the first warp's lanes, a chunk each.
      return Chain{storage.chain, layout.workspace, {num_groups, num_tiles}, group, chunk, sequence_in_block,
                   kStrided ? rank : static_cast<int>(threadIdx.x % kWarp), active};
    } else {
      return RunningPrefix<Acc, kCompensated<C>>{};
    }
  }

  // Where this thread's row begins in each of `operands` (row 0 for inactive threads, which never
  // access it), for Operand::row.
  template <typename... Operands>
  __device__ __forceinline__ RowOffsets<sizeof...(Operands)> row_offsets(const SequenceLayout& layout,
                                                                         const Operands&... operands) const {
    return layout.shape.row_offsets(active ? sequence : 0, operands...);
  }

  // The tile mover of an operand of element type Element (T or C).
  template <typename Element>
  __device__ __forceinline__ const auto& tile_io() const {
    if constexpr (std::is_same_v<Element, T>) return io;
    else return coeff_io;
  }

  // The time stride of an operand this kernel reads (possibly broadcast along time) and of one with
  // the full shape (outputs, gradients): 1 at compile time where the config fixes it, which keeps the
  // loads' offsets immediate (a runtime stride costs the 16-bit staged backward half its speed).
  __device__ __forceinline__ static auto read_stride(const Operand& operand) {
    if constexpr (kStrided || Config.broadcast) return operand.time_stride;
    else return UnitStride{};
  }
  __device__ __forceinline__ static auto full_stride(const Operand& operand) {
    if constexpr (kStrided) return operand.time_stride;
    else return UnitStride{};
  }

  // fetch() of a row of an operand this kernel reads, then arrange() (TileIO) of what it fetched.
  template <typename Element>
  __device__ __forceinline__ void fetch(const Operand& operand, const Element* row, int64_t step,
                                        Acc (&items)[kItems], Acc fill) const {
    tile_io<Element>().fetch(row, read_stride(operand), tile_begin(step), length, items, fill);
  }
  template <typename Element>
  __device__ __forceinline__ void arrange(Acc (&items)[kItems]) const {
    tile_io<Element>().arrange(items);
  }

  // store() of a tile to a row of a full-shape operand.
  template <typename Element>
  __device__ __forceinline__ void store(const Operand& operand, Element* row, int64_t step,
                                        const Acc (&items)[kItems]) const {
    tile_io<Element>().store(row, full_stride(operand), tile_begin(step), length, items);
  }

  // The first element of the tile the scan reaches at `step`.
  __device__ __forceinline__ int64_t tile_begin(int64_t step) const {
    return (ScanReverse ? num_tiles - 1 - step : step) * kTile;
  }

  // The first element of this thread's chunk of that tile.
  __device__ __forceinline__ int64_t chunk_begin(int64_t step) const {
    return tile_begin(step) + static_cast<int64_t>(rank) * kItems;
  }

  template <typename Prefix>
  __device__ __forceinline__ void scan(Acc (&value)[kItems], Acc (&coeff)[kItems], Prefix& prefix) const {
    Scan::scan(value, coeff, scan_storage, prefix);
  }

  // Called by every thread of the block after its tiles, with whether this thread wrote a non-finite
  // result: rescans the rows of the block's sequences that hold one (nonfinite_rescan.h), each by its
  // first thread. Pipe: the block has every tile of its rows, and its threads vote. Chained: the
  // block of a group that finishes last (a count in the workspace, after every block's results are
  // visible) rescans the rows that any of the group's blocks flagged.
  template <typename Params>
  __device__ __forceinline__ void rescan_nonfinite(Storage& storage, const Params& params, bool nonfinite) const {
    bool flagged;
    if constexpr (kChained) {
      static_assert(kSequencesPerBlock <= 32, "a chained group's sequences are bits of one int");
      int* const counters = chain_layout(params).rescan_counters(params.workspace, group);
      if (nonfinite) atomicOr(counters + 1, 1 << sequence_in_block);
      // The block's results, then its count: the barrier orders every thread's stores before the
      // first thread's fence and count, as a grid-wide barrier does; the last block's fence after the
      // count orders its reads after every block's results.
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        storage.last = atomicAdd(counters, 1) == num_tiles - 1;
        __threadfence();
      }
      __syncthreads();
      if (!storage.last) return;
      flagged = __ldcg(counters + 1) >> sequence_in_block & 1;
    } else {
      if (!__syncthreads_or(nonfinite)) return;
      if (threadIdx.x < kSequencesPerBlock) storage.flagged[threadIdx.x] = false;
      __syncthreads();
      if (nonfinite) storage.flagged[sequence_in_block] = true;
      __syncthreads();
      flagged = storage.flagged[sequence_in_block];
    }
    const int64_t row = sequence_of(params);
    if (flagged && rank == 0 && row < params.num_rows()) linrec::rescan_nonfinite<T, C>(params, row);
  }
};

template <typename T, typename C, typename PolicyT>
__global__ void __launch_bounds__(block_threads(PolicyT::config), min_blocks_forward<T>(PolicyT::config))
    pipe_forward_kernel(const __grid_constant__ ForwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  using Thread = PipeThread<T, C, Config, Config.reverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const auto offsets = thread.row_offsets(params, params.inputs, params.coeffs, params.outputs, params.initial).at;
  const T* const inputs = params.inputs.row<const T>(offsets[0]);
  const C* const coeffs = params.coeffs.row<const C>(offsets[1]);
  T* const outputs = params.outputs.row<T>(offsets[2]);
  const SequenceStarts<true> starts{params};
  // The initial states of the row's packed sequences (one without cu_seqlens), if any.
  const C* initial = params.initial.data != nullptr && thread.active ? params.initial.row<const C>(offsets[3]) : nullptr;
  // Past the row's end, coefficients are the identity's: 1 (log 1 = 0 with log_coeffs).
  const Acc coeff_fill = params.log_coeffs ? Acc(0) : Acc(1);

  const int64_t end_step = thread.end_step();
  const auto fetch_tile = [&](int64_t step, Acc(&input_items)[kItems], Acc(&coeff_items)[kItems]) {
    thread.fetch(params.inputs, inputs, step, input_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, coeff_fill);
  };
  Acc value[kItems], coeff[kItems];
  if constexpr (Thread::kPrefetch) fetch_tile(thread.first_step(), value, coeff);
  auto prefix = thread.make_prefix(storage, params);
  bool nonfinite = false;
  for (int64_t step = thread.first_step(); step < end_step; ++step) {
    const int64_t begin = thread.chunk_begin(step);
    if constexpr (!Thread::kPrefetch) fetch_tile(step, value, coeff);
    thread.template arrange<T>(value);
    thread.template arrange<C>(coeff);
    // One uniform branch per tile for the flag, and per chunk a search for the sequence starts in it
    // (one compare without cu_seqlens): branches per item cost the loop a fifth of its speed.
    if (params.log_coeffs) exponentiate(coeff);
    starts.for_each(begin, begin + kItems, [&](int64_t position, int64_t segment) {
      const Acc state = initial != nullptr ? static_cast<Acc>(initial[segment * params.initial.segment_stride]) : Acc(0);
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (begin + i == position) {  // outputs[start] = coeffs[start] * initial + inputs[start]
          if (initial != nullptr) value[i] = coeff[i] * state + value[i];
          coeff[i] = Acc(0);  // the state before the start takes no part, whatever it is
        }
      }
    });
    Acc next_value[kItems], next_coeff[kItems];
    if constexpr (Thread::kPrefetch)
      if (step + 1 < end_step) fetch_tile(step + 1, next_value, next_coeff);
    thread.scan(value, coeff, prefix);
    thread.store(params.outputs, outputs, step, value);
    nonfinite = nonfinite || !all_finite(value);
    if constexpr (Thread::kPrefetch) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i], coeff[i] = next_coeff[i];
    }
  }
  thread.rescan_nonfinite(storage, params, nonfinite);
}

// d_inputs[l] = conj(coeffs[next]) * d_inputs[next] + d_outputs[l], scanning against the forward
// op's direction, d_coeffs[l] = d_inputs[l] * conj(outputs[prev]) (outputs[prev] of the first element:
// initial, or none), times coeffs[l] with log_coeffs, and d_initial = conj(coeffs[first]) * d_inputs[first].
// The Summing variant sums d_coeffs into broadcast coeffs' shape (BackwardParams::sum_d_coeffs).
template <typename T, typename C, typename PolicyT, Variant Kind>
__global__ void __launch_bounds__(block_threads(PolicyT::config))
    pipe_backward_kernel(const __grid_constant__ BackwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  constexpr bool kForwardReverse = Config.reverse;
  using Thread = PipeThread<T, C, Config, !kForwardReverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const int64_t length = thread.length;
  const auto offsets = thread.row_offsets(params, params.d_outputs, params.coeffs, params.outputs, params.d_inputs,
                                          params.d_coeffs, params.initial, params.d_initial).at;
  const T* const d_outputs = params.d_outputs.row<const T>(offsets[0]);
  const C* const coeffs = params.coeffs.row<const C>(offsets[1]);
  const T* const outputs = params.outputs.row<const T>(offsets[2]);
  T* const d_inputs = params.d_inputs.row<T>(offsets[3]);
  C* const d_coeffs = params.d_coeffs.row<C>(offsets[4]);
  // Where the forward op's recurrence starts over.
  const SequenceStarts<Kind == Variant::Packed || Kind == Variant::Summing> starts{params};
  constexpr bool sums = Kind == Variant::Summing;
  const bool has_initial = params.initial.data != nullptr && thread.active;
  const C* initial = has_initial ? params.initial.row<const C>(offsets[5]) : nullptr;
  C* const d_initial = has_initial ? params.d_initial.row<C>(offsets[6]) : nullptr;
  // Broadcast coefficients: their gradient is summed here, into coeffs' shape.
  using CoeffSum = CoeffGradientSum<Acc, Thread::kSegmentLanes, Thread::kSegmentWarps, kItems, block_threads(Config)>;
  [[maybe_unused]] const auto coeff_sum_row = [&params] {
    const int64_t sequence = Thread::sequence_of(params);
    return params.shape.template row_pointers<Acc>(sequence < params.num_rows() ? sequence : 0, params.d_coeffs).at[0];
  };
  if constexpr (sums) CoeffSum::start(params.d_coeffs);

  const int64_t end_step = thread.end_step();
  // A tile needs its three chunks and, from the neighbouring chunks (L1 hits: the neighbour threads
  // load them too), the coefficient just after this thread's chunk and the output just before it,
  // in the forward direction. Past the row's end all values are 0: whatever coefficient is filled in
  // there only multiplies zeros.
  const auto fetch_tile = [&](int64_t step, Acc(&d_output_items)[kItems], Acc(&coeff_items)[kItems],
                              Acc(&output_items)[kItems], Acc& next_coeff_after, Acc& next_output_before) {
    thread.fetch(params.d_outputs, d_outputs, step, d_output_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, Acc(0));
    thread.fetch(params.outputs, outputs, step, output_items, Acc(0));
    const int64_t begin = thread.chunk_begin(step);
    next_coeff_after = load_one(coeffs, Thread::read_stride(params.coeffs), kForwardReverse ? begin - 1 : begin + kItems, length, Acc(0));
    next_output_before = load_one(outputs, Thread::full_stride(params.outputs), kForwardReverse ? begin + kItems : begin - 1, length, Acc(0));
  };

  Acc value[kItems], coeff[kItems], output[kItems], coeff_after, output_before;
  if constexpr (Thread::kPrefetch) fetch_tile(thread.first_step(), value, coeff, output, coeff_after, output_before);
  auto prefix = thread.make_prefix(storage, params);
  bool nonfinite = false;
  for (int64_t step = thread.first_step(); step < end_step; ++step) {
    const int64_t begin = thread.chunk_begin(step);
    if constexpr (!Thread::kPrefetch) fetch_tile(step, value, coeff, output, coeff_after, output_before);
    thread.template arrange<T>(value);
    thread.template arrange<C>(coeff);
    thread.template arrange<T>(output);
    // shifted_coeff: conj of the next coefficient in the forward direction; prev_output: the factor
    // that turns d_inputs into d_coeffs, conj(previous output) (times the coefficient with log_coeffs).
    if (params.log_coeffs) {
      exponentiate(coeff);
      coeff_after = coefficient(coeff_after, true);
    }
    Acc shifted_coeff[kItems], prev_output[kItems];
    #pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int next = kForwardReverse ? i - 1 : i + 1, prev = kForwardReverse ? i + 1 : i - 1;
      shifted_coeff[i] = conj(next >= 0 && next < kItems ? coeff[next] : coeff_after);
      prev_output[i] = conj(prev >= 0 && prev < kItems ? output[prev] : output_before);
    }
    // A start has no predecessor: its factor is its sequence's initial state (d_coeffs is zeroed below
    // without one). The element before it in the forward direction has no successor.
    const int64_t window_begin = kForwardReverse ? begin - 1 : begin;
    uint32_t chunk_starts = 0;  // bit i: item i starts a sequence
    starts.for_each(window_begin, window_begin + kItems + 1, [&](int64_t position, int64_t segment) {
      const int64_t at = position - begin, before = kForwardReverse ? at + 1 : at - 1;
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (i == at) {
          chunk_starts |= 1u << i;
          if (initial != nullptr) prev_output[i] = conj(static_cast<Acc>(initial[segment * params.initial.segment_stride]));
        }
        if (i == before) shifted_coeff[i] = Acc(0);
      }
    });
    if (params.log_coeffs) {  // d/d(log c) = c * d/dc
      #pragma unroll
      for (int i = 0; i < kItems; ++i) prev_output[i] = prev_output[i] * coeff[i];
    }
    // coeff and output are consumed above: they take the next tile's values.
    Acc next_value[kItems];
    if constexpr (Thread::kPrefetch)
      if (step + 1 < end_step) fetch_tile(step + 1, next_value, coeff, output, coeff_after, output_before);
    thread.scan(value, shifted_coeff, prefix);
    #pragma unroll
    for (int i = 0; i < kItems; ++i) prev_output[i] = value[i] * prev_output[i];
    // Without an initial state a start's coefficient takes no part. With one, d_initial =
    // conj(coeffs[start]) * d_inputs[start], the coefficient read again (coeff[] may hold the next tile
    // by now) and the starts' sequences found again: only in the chunks that hold a start.
    if (chunk_starts != 0 && d_initial == nullptr) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i)
        if (chunk_starts >> i & 1u) prev_output[i] = Acc(0);
    } else if (chunk_starts != 0) {
      starts.for_each(begin, begin + kItems, [&](int64_t position, int64_t segment) {
        const Acc start_coeff = coefficient(load_one(coeffs, Thread::read_stride(params.coeffs), position, length, Acc(0)),
                                            params.log_coeffs);
        #pragma unroll
        for (int i = 0; i < kItems; ++i)
          if (begin + i == position) d_initial[segment * params.d_initial.segment_stride] = static_cast<C>(conj(start_coeff) * value[i]);
      });
    }
    thread.store(params.d_inputs, d_inputs, step, value);
    nonfinite = nonfinite || !all_finite(value);
    if constexpr (sums) CoeffSum::add(params.d_coeffs, coeff_sum_row, params.seq_len, prev_output, begin, length);
    else thread.store(params.d_coeffs, d_coeffs, step, prev_output);
    if constexpr (Thread::kPrefetch) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i];
    }
  }
  if constexpr (sums) CoeffSum::finish(params.d_coeffs, coeff_sum_row);
  thread.rescan_nonfinite(storage, params, nonfinite);
}

bool is_aligned(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Whether every row of `operand` starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const SequenceLayout& layout, const Operand& operand) {
  bool aligned = is_aligned(operand.data);
  for (int d = 0; d < layout.shape.num_dims; ++d)
    aligned = aligned && operand.strides[d] * static_cast<int64_t>(sizeof(T)) % 16 == 0;
  return aligned;
}

int multiprocessor_count() {
  int device = 0, count = 0;
  LINREC_CUDA_CHECK(cudaGetDevice(&device));
  LINREC_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

bool contiguous_in_time(const Operand& operand) { return operand.time_stride == 1; }
bool readable_in_time(const Operand& operand) { return operand.time_stride == 1 || operand.time_stride == 0; }

// The operands of one call: those it reads (possibly broadcast) and those it writes (full shape).
struct OperandSet {
  std::vector<Operand> reads, writes;
};

OperandSet operands_of(const ForwardParams& params) { return {{params.inputs, params.coeffs}, {params.outputs}}; }
// The forward kernel is one for every call.
Variant variant_of(const ForwardParams&) { return Variant::Plain; }
Variant variant_of(const BackwardParams& params) {
  return params.sum_d_coeffs ? Variant::Summing : params.cu_seqlens != nullptr ? Variant::Packed : Variant::Plain;
}
// A summed d_coeffs is not among the writes: it is added into, not stored tile by tile.
OperandSet operands_of(const BackwardParams& params) {
  if (params.sum_d_coeffs) return {{params.d_outputs, params.coeffs, params.outputs}, {params.d_inputs}};
  return {{params.d_outputs, params.coeffs, params.outputs}, {params.d_inputs, params.d_coeffs}};
}

// The config for a call. Time-contiguous operands (read ones may be broadcast along time) take the
// row kernels: many sequences a pipe each, the smallest tile holding the whole sequence (else the
// largest, looping); few long ones chained across blocks; Vectorized (pipes) or the chains' aligned
// access where every row of every operand is aligned. A config forced in the params picks the tile
// shape of the row kernels. Other strides take the strided kernels, piped or chained by the same rule.
template <typename T, typename C>
PipeConfig choose_config(const SequenceLayout& layout, const OperandSet& operands, Variant variant,
                         int multiprocessors) {
  bool time_last = true, broadcast = false, aligned = layout.seq_len * static_cast<int64_t>(sizeof(T)) % 16 == 0;
  for (const Operand& operand : operands.reads) {
    time_last = time_last && readable_in_time(operand);
    broadcast = broadcast || operand.time_stride == 0;
    aligned = aligned && rows_aligned<T>(layout, operand);
  }
  for (const Operand& operand : operands.writes) {
    time_last = time_last && contiguous_in_time(operand);
    aligned = aligned && rows_aligned<T>(layout, operand);
  }
  const bool forced = layout.threads_per_sequence > 0;
  const bool few_rows = layout.num_rows() < static_cast<int64_t>(kPipeRowsPerMultiprocessor) * multiprocessors;
  const Access access = aligned ? Access::Vectorized : Access::Staged;
  const Access chained_access = aligned ? kChainedAlignedAccess<T> : Access::Staged;
  if (time_last && broadcast && (forced || !few_rows))
    return PipeConfig{kBroadcastTileShape[0], kBroadcastTileShape[1], layout.reverse, Access::Staged, true};
  if (time_last && !broadcast) {
    if (forced) {
      const bool chained = layout.threads_per_sequence == kChainedTileShape[0];
      return PipeConfig{layout.threads_per_sequence, layout.vectors_per_thread, layout.reverse,
                        chained ? chained_access : access, false, chained ? Schedule::Chained : Schedule::Pipe};
    }
    const PipeConfig chained{kChainedTileShape[0], kChainedTileShape[1], layout.reverse, chained_access, false,
                             Schedule::Chained};
    if (few_rows && layout.seq_len > tile_length<T>(chained)) return chained;
    for (const auto& [threads, vectors] : kTileShapes) {
      const PipeConfig pipe{threads, vectors, layout.reverse, access};
      if (compiled_for<T, C>(pipe, variant) && tile_length<T>(pipe) >= layout.seq_len) return pipe;
    }
    return PipeConfig{kTileShapes.back()[0], kTileShapes.back()[1], layout.reverse, access};
  }
  // Strided time, or few rows broadcast along time (one lane per row, rather than a pipe per row).
  const int64_t groups = (layout.num_rows() + kWarp - 1) / kWarp;
  PipeConfig strided{kStridedTileShape[0], kStridedTileShape[1], layout.reverse, Access::Strided};
  if (groups < static_cast<int64_t>(kPipeGroupsPerMultiprocessor) * multiprocessors &&
      layout.seq_len > tile_length<T>(strided))
    strided.schedule = Schedule::Chained;
  return strided;
}

template <typename Visit>
void for_each_operand(ForwardParams& params, Visit&& visit) {
  for (Operand* operand : {&params.inputs, &params.coeffs, &params.outputs, &params.initial}) visit(*operand);
}
template <typename Visit>
void for_each_operand(BackwardParams& params, Visit&& visit) {
  for (Operand* operand : {&params.d_outputs, &params.coeffs, &params.outputs, &params.initial, &params.d_inputs,
                           &params.d_coeffs, &params.d_initial})
    visit(*operand);
}

// Re-describes `params` over ChannelPair elements: the innermost batch dim (channels) counts pairs,
// and every stride is halved. Possible where every operand steps through that dim with stride 1
// (none is broadcast across channels), the dim is even, and every other stride and pointer keeps the
// pairs 2-element aligned; returns false (and leaves `params` as it was) otherwise.
template <typename T, typename Params>
bool pair_channels(Params& params) {
  const int inner = params.shape.num_dims - 1;
  if (inner < 0 || params.shape.sizes[inner] % 2 != 0) return false;
  bool pairable = true;
  for_each_operand(params, [&](Operand& operand) {
    if (operand.data == nullptr) return;
    pairable = pairable && operand.strides[inner] == 1 && operand.time_stride % 2 == 0 &&
               operand.segment_stride % 2 == 0 && reinterpret_cast<uintptr_t>(operand.data) % (2 * sizeof(T)) == 0;
    for (int d = 0; d < inner; ++d) pairable = pairable && operand.strides[d] % 2 == 0;
  });
  if (!pairable) return false;
  int64_t sizes[kMaxBatchDims];
  std::copy(params.shape.sizes, params.shape.sizes + kMaxBatchDims, sizes);
  sizes[inner] /= 2;
  params.shape = BatchShape::of(sizes, params.shape.num_dims);
  for_each_operand(params, [&](Operand& operand) {
    operand.time_stride /= 2;
    operand.segment_stride /= 2;
    for (int d = 0; d < inner; ++d) operand.strides[d] /= 2;
  });
  return true;
}

// Calls body.template operator()<T, C, Config>(launched) with the element types of inputs and of
// coefficients, the config and the params of a call: 16-bit types along strided time take channel
// pairs where the layout allows, the call pipes and the coefficients are 16-bit too. Pairs halve the
// channel groups, so that fewer blocks fill the GPU, each moving twice the bytes an access; chained, a
// pair holds twice a float lane's look-back state, which costs more than the wider accesses gain
// (docs/design.md, Strided time).
template <typename Params, typename Body>
void dispatch_call(const Params& params, Body&& body) {
  const int multiprocessors = multiprocessor_count();
  dispatch_dtypes<__half, __nv_bfloat16>(params.dtype, params.coeff_dtype, [&]<typename T, typename C>() {
    const auto run = [&]<typename Element, typename CoeffElement>(const Params& launched, const PipeConfig& config) {
      dispatch_config<kPipeConfigs>(config, [&]<PipeConfig Config>() {
        if constexpr (compiled_for<Element, CoeffElement>(Config))
          body.template operator()<Element, CoeffElement, Config>(launched);
        else
          throw std::invalid_argument("linrec: no kernel is compiled for config " + describe(Config) + " with " +
                                      dtype_name(params.dtype) + " inputs and " + dtype_name(params.coeff_dtype) +
                                      " coefficients");
      });
    };
    const PipeConfig config = choose_config<T, C>(params, operands_of(params), variant_of(params), multiprocessors);
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, C>) {
      Params paired = params;
      if (config.access == Access::Strided && config.schedule == Schedule::Pipe && pair_channels<T>(paired))
        return run.template operator()<ChannelPair<T>, ChannelPair<T>>(paired, config);
    }
    run.template operator()<T, C>(params, config);
  });
}

// Blocks of a launch: one per group of sequences (Pipe), one per chunk of every group (Chained).
template <typename T, typename C, PipeConfig Config>
dim3 grid_for(const SequenceLayout& layout) {
  const auto chain = PipeThread<T, C, Config, false>::chain_layout(layout);
  return dim3(static_cast<unsigned>(Config.schedule == Schedule::Chained ? chain.num_blocks() : chain.num_groups));
}

template <typename Params>
int64_t pipe_workspace_bytes(const Params& params) {
  int64_t bytes = 0;
  dispatch_call(params, [&]<typename T, typename C, PipeConfig Config>(const Params& launched) {
    if constexpr (Config.schedule == Schedule::Chained) bytes = PipeThread<T, C, Config, false>::chain_layout(launched).bytes();
  });
  return bytes;
}

// A chained config's workspace, checked: a launch without one would read through null pointers.
template <PipeConfig Config>
void check_workspace(const SequenceLayout& layout) {
  if (Config.schedule == Schedule::Chained && layout.workspace == nullptr)
    throw std::invalid_argument("linrec: the chained kernels need the workspace that workspace_bytes() asks for");
}

}  // namespace

int64_t workspace_bytes(const ForwardParams& params) {
  return params.numel() > 0 ? pipe_workspace_bytes(params) : 0;
}

int64_t workspace_bytes(const BackwardParams& params) {
  return params.numel() > 0 ? pipe_workspace_bytes(params) : 0;
}

void launch_pipe_forward(const ForwardParams& params, cudaStream_t stream) {
  dispatch_call(params, [&]<typename T, typename C, PipeConfig Config>(const ForwardParams& launched) {
    check_workspace<Config>(launched);
    pipe_forward_kernel<T, C, Policy<Config>><<<grid_for<T, C, Config>(launched), block_threads(Config), 0, stream>>>(launched);
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

void launch_pipe_backward(const BackwardParams& params, cudaStream_t stream) {
  dispatch_call(params, [&]<typename T, typename C, PipeConfig Config>(const BackwardParams& launched) {
    check_workspace<Config>(launched);
    const auto launch = [&]<Variant Kind>() {
      if constexpr (compiled_for<T, C>(Config, Kind))
        pipe_backward_kernel<T, C, Policy<Config>, Kind><<<grid_for<T, C, Config>(launched), block_threads(Config), 0, stream>>>(launched);
      else
        throw std::invalid_argument("linrec: no backward kernel is compiled for config " + describe(Config) +
                                    " with packed sequences or a summed coefficient gradient (they take the largest row tile)");
    };
    switch (variant_of(launched)) {
      case Variant::Plain: launch.template operator()<Variant::Plain>(); break;
      case Variant::Packed: launch.template operator()<Variant::Packed>(); break;
      case Variant::Summing: launch.template operator()<Variant::Summing>(); break;
    }
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

const void* probe_kernel() {
  return reinterpret_cast<const void*>(pipe_forward_kernel<float, float, Policy<kPipeConfigs[0]>>);
}

}  // namespace cuda
}  // namespace linrec
