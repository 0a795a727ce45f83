// The bulk family's agent: what one thread of either kernel does with the chunks its block takes
// (BulkThread). A block is persistent: it takes chunks of the chunk-major order (lookback.h) in one of
// two orders (ChunkOrder), keeps a ring of their boxes in flight (the first thread takes a chunk and
// issues its stage's copies as soon as the chunk before in that stage is stored), and scans each chunk
// as the chained strided kernels do: lanes on channels, warps along time, the carry looked back at.
#pragma once

#include "linrec/block_scan.h"
#include "linrec/bulk/policy.cuh"
#include "linrec/bulk_copy.cuh"
#include "linrec/lookback.h"
#include "linrec/nonfinite_rescan.h"
#include "linrec/numeric.h"

namespace linrec::cuda::bulk {

// How the blocks share out the chunks (the plan chooses; docs/design.md, Bulk-copied strided time).
// ByBlock: block b takes chunks b, b + gridDim.x, ...; a round of the grid holds the same chunks
// whatever the timing, so where a group's chunks follow each other within a round (fewer groups than
// blocks) each block lags the one it waits for by a stable step. FromCounter: each block takes the
// next chunk from a counter in the workspace when a stage frees, so that blocks which run faster take
// more chunks; where a chunk's predecessor lies a round or more before it (as many groups as blocks)
// nothing waits, and the grid's load evens out. Either order waits only on chunks of lower number,
// held by blocks that the cooperative launch keeps resident.
enum class ChunkOrder : int { ByBlock, FromCounter };

// What a launch passes beside the params: the tensor maps of the boxes a kernel loads (the forward's
// inputs and coefficients; the backward's upstream gradient, coefficients and outputs) and stores (the
// forward's outputs; the backward's d_inputs and d_coeffs), and the order of chunks.
struct BulkMaps {
  CUtensorMap first, coeffs, outputs;
  CUtensorMap results[2];
  ChunkOrder order;
};

// One chunk: its group (a batch row's tile of 32 channels) and its place along time. Counts within
// a call fit 32 bits (plan.cuh: fits), which keeps the registers of the chunk's bookkeeping few.
struct Chunk {
  int group;
  int index;   // in scan order
  int batch;   // the batch row (0 with one batch dim)
  int tile;    // of channels, within the row
  int begin;   // the box's first step, in memory order
  bool exists; // false past the last chunk
};

template <typename T, typename C, BulkConfig Config, bool Backward>
struct BulkThread {
  using Acc = accumulator_t<T>;
  // The backward runs against the forward op's direction.
  static constexpr bool kScanReverse = Config.reverse != Backward;
  static constexpr int kItems = bulk::kItems<T>;
  static constexpr int kChunk = bulk::kChunk<T>;
  static constexpr int kStages = bulk::kStages<T, C, Backward>;
  using Stage = StageLayout<T, C, Backward>;
  using Scan = TileScan<1, kWarps, kItems, kScanReverse, kCompensated<C>>;
  // The look-back of strided time: the whole block, 4 chunks a thread of each of 32 channels.
  using WindowScan = TileScan<1, kWarps, 4, false, kCompensated<C>>;
  using Chain = ChainedPrefix<Acc, kChannels, WindowScan, 4, kThreads>;
  struct Storage {
    typename Scan::template Storage<Acc> scan;
    typename Chain::Storage chain;
    uint64_t landed[kStages];  // a barrier per stage: its boxes have landed
    int number[kStages];       // the chunk each stage holds (past the last chunk: none), set with its copies
    bool last;                 // whether this block is the grid's last to finish
    bool flagged;              // whether this block flagged a row (in shared memory: no register held)
  };

  Storage& storage;
  unsigned char* const ring;
  const int lane = threadIdx.x % kWarp;  // the channel within the tile
  const int rank = threadIdx.x / kWarp;  // the warp's place along the chunk
  const int channels, tiles_per_row, num_groups, num_chunks;
  int upcoming = 0;  // FromCounter: the first thread's next chunk, taken one load ahead (its atomic's round trip
                    // off the critical path)

  __device__ __forceinline__ BulkThread(Storage& storage_, unsigned char* ring_, const SequenceLayout& layout)
      : storage(storage_),
        ring(ring_),
        channels(static_cast<int>(layout.shape.sizes[layout.shape.num_dims - 1])),
        tiles_per_row((channels + kChannels - 1) / kChannels),
        num_groups(static_cast<int>(layout.num_rows() / channels) * tiles_per_row),
        num_chunks(static_cast<int>((layout.seq_len + kChunk - 1) / kChunk)) {}

  __host__ __device__ static typename Chain::Layout chain_layout(const SequenceLayout& layout) {
    const int64_t channels = layout.shape.sizes[layout.shape.num_dims - 1];
    const int64_t tiles = (channels + kChannels - 1) / kChannels;
    return {layout.num_rows() / channels * tiles, (layout.seq_len + kChunk - 1) / kChunk};
  }

  // The chunk of number `number` in the chunk-major order.
  __device__ __forceinline__ Chunk chunk(int number) const {
    Chunk chunk;
    chunk.exists = number < num_groups * num_chunks;
    chunk.index = number / num_groups;
    chunk.group = number % num_groups;
    chunk.batch = chunk.group / tiles_per_row;
    chunk.tile = chunk.group % tiles_per_row;
    chunk.begin = (kScanReverse ? num_chunks - 1 - chunk.index : chunk.index) * kChunk;
    return chunk;
  }

  // This thread's channel of a chunk: whether it exists, and its row (BatchShape).
  __device__ __forceinline__ int channel(const Chunk& chunk) const { return chunk.tile * kChannels + lane; }
  __device__ __forceinline__ bool active(const Chunk& chunk) const { return channel(chunk) < channels; }
  __device__ __forceinline__ int64_t row(const Chunk& chunk) const {
    return static_cast<int64_t>(chunk.batch) * channels + channel(chunk);
  }

  // The boxes of stage `stage`: the first operand's, the coefficients', the outputs' (backward).
  __device__ __forceinline__ T* first_slot(int stage) const {
    return reinterpret_cast<T*>(ring + stage * Stage::kBytes);
  }
  __device__ __forceinline__ C* coeff_slot(int stage) const {
    return reinterpret_cast<C*>(ring + stage * Stage::kBytes + Stage::kFirstBytes);
  }
  __device__ __forceinline__ T* output_slot(int stage) const {
    return reinterpret_cast<T*>(ring + stage * Stage::kBytes + Stage::kFirstBytes + Stage::kCoeffBytes);
  }

  // The first step of the extra-row boxes of the backward: the coefficients reach one step towards
  // the next element of the forward op, the outputs one step towards the previous one.
  __device__ __forceinline__ static int coeff_box_shift() { return Config.reverse ? -1 : 0; }
  __device__ __forceinline__ static int output_box_shift() { return Config.reverse ? 0 : -1; }

  // Takes the block's k-th chunk and issues the copies of its boxes into its stage (first thread
  // only). Past the last chunk, the stage's barrier completes with no copies, and the stage says none.
  __device__ __forceinline__ void load(const SequenceLayout& layout, const BulkMaps& maps, int64_t k) {
    const bool by_block = maps.order == ChunkOrder::ByBlock;
    // Numbers past the last chunk stay within 32 bits: the plan keeps the chunks under 2^30.
    const int number = by_block ? static_cast<int>(blockIdx.x + k * gridDim.x) : upcoming;
    const Chunk next = chunk(number);
    if (next.exists && !by_block) upcoming = atomicAdd(next_chunk(layout), 1);
    const int stage = static_cast<int>(k % kStages);
    uint64_t* const landed = &storage.landed[stage];
    storage.number[stage] = number;  // read by the block after the barrier completes
    if (!next.exists) {
      expect_bytes(landed, 0);
      return;
    }
    const int channel = next.tile * kChannels;
    expect_bytes(landed, Stage::kCopiedBytes);
    load_box(first_slot(stage), maps.first, channel, next.begin, next.batch, landed);
    const int coeff_begin = next.begin + (Backward ? coeff_box_shift() : 0);
    load_box(coeff_slot(stage), maps.coeffs, channel, coeff_begin, next.batch, landed);
    if constexpr (Backward)
      load_box(output_slot(stage), maps.outputs, channel, next.begin + output_box_shift(), next.batch, landed);
  }

  // Sets up the ring and issues the first kStages chunks' copies.
  __device__ __forceinline__ void start(const SequenceLayout& layout, const BulkMaps& maps) {
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < kStages; ++stage) init_barrier(&storage.landed[stage]);
      storage.flagged = false;
      if (maps.order == ChunkOrder::FromCounter) upcoming = atomicAdd(next_chunk(layout), 1);
      for (int k = 0; k < kStages; ++k) load(layout, maps, k);
    }
    __syncthreads();
  }

  // A kernel's body: declares the block's shared memory (the ring, dynamic, and the Storage), and runs
  // body(thread, chunk, stage) on every chunk the block takes, once its boxes have landed in `stage`;
  // body returns whether this thread's results hold a non-finite value. Then the rescan of rows with
  // one (rescan_nonfinite).
  template <typename Params, typename Body>
  __device__ __forceinline__ static void run(const Params& params, const BulkMaps& maps, Body&& body) {
    extern __shared__ __align__(128) unsigned char dynamic_ring[];
    __shared__ Storage block_storage;
    BulkThread thread(block_storage, dynamic_ring, params);
    thread.start(params, maps);
    for (int64_t k = 0;; ++k) {
      const int stage = static_cast<int>(k % kStages);
      wait_barrier(&block_storage.landed[stage], static_cast<uint32_t>(k / kStages % 2));
      const Chunk taken = thread.chunk(block_storage.number[stage]);
      if (!taken.exists) break;
      const bool nonfinite = body(thread, taken, stage);
      thread.finish(params, maps, taken, k, nonfinite);
    }
    thread.rescan_nonfinite(params);
  }

  // Element `row` (of the box, from its first step) of this thread's channel in a slot.
  template <typename Element>
  __device__ __forceinline__ Acc item(const Element* slot, int row) const {
    return static_cast<Acc>(slot[row * kChannels + lane]);
  }
  // This thread's steps of a slot, shifted by `shift` rows.
  template <typename Element>
  __device__ __forceinline__ void read(const Element* slot, Acc (&items)[kItems], int shift = 0) const {
    #pragma unroll
    for (int i = 0; i < kItems; ++i) items[i] = item(slot, rank * kItems + i + shift);
  }
  // Writes this thread's results into a slot, in place of what it read there, and makes them visible
  // to the copy unit, which copies them out (store_results) after a barrier.
  template <typename Element>
  __device__ __forceinline__ void write_results(Element* slot, const Acc (&items)[kItems]) const {
    #pragma unroll
    for (int i = 0; i < kItems; ++i) slot[(rank * kItems + i) * kChannels + lane] = static_cast<Element>(items[i]);
    fence_writes_for_copies();
  }

  // Stores a slot's box of results (written there by every thread with write_results: call after a
  // barrier) to the tensor of `map`, at the chunk's place: the first thread issues the copy unit's
  // store, which leaves out the steps past the row's end and the channels past the last.
  __device__ __forceinline__ void store_results(const CUtensorMap& map, const Chunk& chunk, const void* slot) const {
    if (threadIdx.x == 0) store_box(map, slot, chunk.tile * kChannels, chunk.begin, chunk.batch);
  }

  // The prefix hook of a chunk: the look-back across the chunks of its group.
  __device__ __forceinline__ Chain prefix(const SequenceLayout& layout, const Chunk& chunk) const {
    return Chain{storage.chain, chain_workspace(layout), {num_groups, num_chunks}, chunk.group, chunk.index, lane, rank,
                 active(chunk)};
  }

  // The workspace: four counters (the next chunk to take, the blocks that have finished, whether any
  // row is flagged, the next group to rescan) in the first 16 bytes, where their addresses need no
  // arithmetic; then the look-back's statuses and, per group, the rescan flags of lookback.h (rows
  // with a non-finite result).
  static constexpr int64_t kCountersBytes = 16;
  __host__ __device__ static int64_t workspace_bytes(const SequenceLayout& layout) {
    return kCountersBytes + chain_layout(layout).bytes();
  }
  __device__ __forceinline__ static int* next_chunk(const SequenceLayout& layout) {
    return static_cast<int*>(layout.workspace);
  }
  __device__ __forceinline__ static int* blocks_done(const SequenceLayout& layout) { return next_chunk(layout) + 1; }
  __device__ __forceinline__ static int* any_flagged(const SequenceLayout& layout) { return next_chunk(layout) + 2; }
  __device__ __forceinline__ static int* next_rescan_group(const SequenceLayout& layout) { return next_chunk(layout) + 3; }
  __device__ __forceinline__ static void* chain_workspace(const SequenceLayout& layout) {
    return static_cast<char*>(layout.workspace) + kCountersBytes;
  }
  __device__ __forceinline__ int* row_flags(const SequenceLayout& layout, int64_t group) const {
    return chain_layout(layout).rescan_flags(chain_workspace(layout), group);
  }

  // After a chunk's stores are issued (every thread is done with its stage, by the barrier before
  // them): flags the rows where this thread wrote a non-finite result; the first thread commits the
  // stores and, once they have read the stage, issues the copies of the chunk kStages on into it.
  __device__ __forceinline__ void finish(const SequenceLayout& layout, const BulkMaps& maps, const Chunk& done,
                                         int64_t k, bool nonfinite) {
    // One atomic a warp, lane 0's for its warp's channels: in an all-NaN call every thread of every
    // chunk flags its row, and an atomic a thread (two, with any_flagged) held bfloat16
    // (16, 2048, 1024) at 0.14 of torch.add.
    const unsigned lanes = __ballot_sync(0xffffffffu, nonfinite);
    if (lanes != 0 && lane == 0) {
      storage.flagged = true;
      atomicOr(row_flags(layout, done.group), static_cast<int>(lanes));
    }
    if (threadIdx.x == 0) {
      commit_stores();
      wait_stores_read();
      load(layout, maps, k + kStages);
    }
  }

  // The rescan of non-finite results (nonfinite_rescan.h): once every chunk is stored, the rows that
  // hold one are scanned again. The blocks count themselves once each, so that no chunk waits on a fence
  // (a count per chunk would wait for the chunk's stores). A block that flagged no row leaves, but the
  // last to count where any row is flagged: a finite call costs the count alone. The blocks that stay
  // wait until every block has counted (the cooperative launch holds them all resident) and take groups
  // from a counter, a warp a group, its flagged rows a lane each; in an all-NaN call every block stays,
  // and the grid rescans as fast as it scanned.
  template <typename Params>
  __device__ __forceinline__ void rescan_nonfinite(const Params& params) {
    __syncthreads();  // every thread's flags, before the first thread's fence and count
    if (threadIdx.x == 0) {
      wait_stores_written();
      if (storage.flagged) atomicOr(any_flagged(params), 1);
      __threadfence();
      storage.last = atomicAdd(blocks_done(params), 1) == static_cast<int>(gridDim.x) - 1;
      __threadfence();  // every block's results, read after its count
    }
    __syncthreads();
    if (!storage.flagged && !(storage.last && __ldcg(any_flagged(params)) != 0)) return;
    if (!storage.last) {
      if (threadIdx.x == 0) {
        const volatile int* const done = blocks_done(params);
        while (*done < static_cast<int>(gridDim.x)) __nanosleep(256);
        __threadfence();
      }
      __syncthreads();
    }
    rescan_flagged_groups(params, tiles_per_row, channels, num_groups);
  }

  // A staying block's share of the rescan: groups from the counter, a warp each, its flagged rows a lane
  // each or, where few, a warp each (nonfinite_rescan.h). Not inlined, so that few registers are live
  // across it; its own count in the kernel's, which the scan's launch bounds already cap.
  template <typename Params>
  __device__ __noinline__ static void rescan_flagged_groups(const Params& params, int tiles_per_row, int channels,
                                                            int num_groups) {
    const int lane = threadIdx.x % kWarp;
    for (;;) {
      int group = 0;
      if (lane == 0) group = atomicAdd(next_rescan_group(params), 1);
      group = __shfl_sync(0xffffffffu, group, 0);
      if (group >= num_groups) return;
      const int tile_begin = group % tiles_per_row * kChannels;
      unsigned flags = static_cast<unsigned>(__ldcg(chain_layout(params).rescan_flags(chain_workspace(params), group)));
      if (channels - tile_begin < kChannels) flags &= (1u << (channels - tile_begin)) - 1u;  // the row's last tile
      const int64_t first_row = static_cast<int64_t>(group / tiles_per_row) * channels + tile_begin;
      if (flags != 0) linrec::rescan_neighbouring_rows<kOwnDepth, T, C>(params, flags, first_row);
    }
  }
};

}  // namespace linrec::cuda::bulk
