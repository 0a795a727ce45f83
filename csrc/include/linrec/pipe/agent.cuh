// The pipe family's agent: what one thread of either kernel does with its sequence's tiles (PipeThread).
#pragma once

#include <type_traits>

#include "linrec/block_scan.h"
#include "linrec/lookback.h"
#include "linrec/memio.h"
#include "linrec/nonfinite_rescan.h"
#include "linrec/numeric.h"
#include "linrec/pipe/policy.cuh"

namespace linrec::cuda::pipe {

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
  // where a thread's loads are element by element (Strided: many loads in flight already) or a block
  // scans one tile (figures in docs/design.md, Kernel configurations).
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

  // Whether a tile whose items hold no sequence start takes the plain path (TileScan::scan's
  // `resets`) rather than the reset path, two more instructions an item. Chained blocks: each scans
  // one tile and then waits, with nothing else in flight, so those instructions are on its path to
  // memory (float32 1 x 2^24 forward 0.60 -> 0.74 of torch.add). The forwards of pipes over long rows
  // (tiles of a warp or more) with real 32-bit or wider coefficients, where every tile but a row's
  // first holds no start: float32 2048 x 16384 reverse with an initial state forward 0.76 -> 0.88 on an
  // H200. Not their backwards (float32 13200 x 16384 backward 0.86 -> 0.75: the fused backward's two
  // paths cost it registers), nor pipes of 16-bit coefficients (bfloat16 13200 x 1024 forward
  // 0.82 -> 0.77), nor short rows, whose one tile holds the start.
  static constexpr bool kPlainWithoutStarts =
      kChained || (!kStrided && ScanReverse == Config.reverse && Config.threads_per_sequence >= kWarp &&
                   !is_complex<C>::value && sizeof(C) >= sizeof(float));

  // `resets`: whether the thread's items hold a sequence start (TileScan::scan).
  template <typename Prefix>
  __device__ __forceinline__ void scan(Acc (&value)[kItems], Acc (&coeff)[kItems], Prefix& prefix, bool resets) const {
    Scan::scan(value, coeff, scan_storage, prefix, kPlainWithoutStarts ? resets : true);
  }

  // Called by every thread of the block after its tiles, with whether this thread wrote a non-finite
  // result. Pipe: the block has every tile of its rows; its threads vote, and the rows of the block's
  // sequences that hold one are rescanned (nonfinite_rescan.h), a warp each. Chained: the
  // thread flags its sequence in the workspace, for pipe_rescan_kernel, launched after the chained
  // kernel; a block that counted itself done for a last block to rescan would first wait on a fence
  // for its stores.
  template <typename Params>
  __device__ __forceinline__ void rescan_nonfinite(Storage& storage, const Params& params, bool nonfinite) const {
    if constexpr (kChained) {
      // One atomic a warp: in an all-NaN row every thread has a non-finite result.
      static_assert(kSequencesPerBlock <= 32, "a chained group's sequences are bits of one int");
      const unsigned flags = __reduce_or_sync(0xffffffffu, nonfinite ? 1u << sequence_in_block : 0u);
      if (flags != 0 && threadIdx.x % kWarp == 0)
        atomicOr(chain_layout(params).rescan_flags(params.workspace, group), static_cast<int>(flags));
    } else {
      if (!__syncthreads_or(nonfinite)) return;
      if (threadIdx.x < kSequencesPerBlock) storage.flagged[threadIdx.x] = false;
      __syncthreads();
      if (nonfinite) storage.flagged[sequence_in_block] = true;
      __syncthreads();
      linrec::rescan_flagged_rows<kScanEndDepth, Config.access == Access::Strided, T, C>(
          params, storage.flagged, kSequencesPerBlock, group * kSequencesPerBlock);
    }
  }

  // pipe_rescan_kernel's work: rescans the sequences of group blockIdx.x that a block of the chained
  // launch before flagged, a warp each.
  template <typename Params>
  __device__ __forceinline__ static void rescan_flagged(const Params& params) {
    const int64_t group = blockIdx.x;
    const unsigned flags = static_cast<unsigned>(*chain_layout(params).rescan_flags(params.workspace, group));
    if (flags != 0) linrec::rescan_flagged_rows<kOwnDepth, T, C>(params, flags, group * kSequencesPerBlock);
  }
};

}  // namespace linrec::cuda::pipe
