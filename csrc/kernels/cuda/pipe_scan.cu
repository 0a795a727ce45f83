// The parallel scan kernels: each sequence is scanned by a segment of ThreadsPerSequence threads,
// tile after tile, carrying the running output between tiles (a pipe; one tile is the tile case).
// Short sequences pack several segments into one 128-thread block. Forward and the fused backward
// share the TileScan primitive (block_scan.h) and the chunk loads and stores (memio.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <initializer_list>
#include <type_traits>

#include "families.h"
#include "linrec/block_scan.h"
#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"
#include "linrec/memio.h"
#include "linrec/numeric.h"

namespace linrec {

// A compiled kernel configuration; items per thread = ItemsPerVector(dtype) * vectors_per_thread.
struct PipeConfig {
  int threads_per_sequence;
  int vectors_per_thread;
  bool reverse;
  Access access;  // Vectorized needs 16-byte aligned rows and pointers; Staged takes any alignment
  bool broadcast = false;  // an operand it reads is broadcast along time (time stride 0); Staged only
  constexpr bool operator==(const PipeConfig&) const = default;
};

inline std::string describe(const PipeConfig& config) {
  return "{threads_per_sequence=" + std::to_string(config.threads_per_sequence) +
         ", vectors_per_thread=" + std::to_string(config.vectors_per_thread) +
         ", reverse=" + std::to_string(config.reverse) + ", access=" + access_name(config.access) +
         ", broadcast=" + std::to_string(config.broadcast) + "}";
}

namespace cuda {
namespace {

// (threads per sequence, 16-byte vectors per thread), smallest tile first. Up to 32 threads a sequence
// is one warp or less, several sequences packed into a block; 64 threads, a block per sequence. Larger
// tiles measured no faster on an H100 (python -m linrec.tune, docs/benchmarks.md).
constexpr std::array<std::array<int, 2>, 7> kTileShapes{{{2, 1}, {4, 1}, {8, 1}, {16, 1}, {32, 1}, {32, 2}, {64, 2}}};

// Operands broadcast along time (one coefficient per row, or an expanded gradient) are rare enough
// for one tile shape: the largest, Staged, whatever the length.
constexpr std::array<int, 2> kBroadcastTileShape = kTileShapes.back();

constexpr auto kPipeConfigs = [] {
  std::array<PipeConfig, kTileShapes.size() * 4 + 2> configs{};
  int n = 0;
  for (const auto& [threads, vectors] : kTileShapes)
    for (bool reverse : {false, true})
      for (Access access : {Access::Vectorized, Access::Staged}) configs[n++] = PipeConfig{threads, vectors, reverse, access};
  for (bool reverse : {false, true})
    configs[n++] = PipeConfig{kBroadcastTileShape[0], kBroadcastTileShape[1], reverse, Access::Staged, true};
  return configs;
}();

constexpr int kPackedBlockThreads = 128;

// PipeConfig as a type, for the kernels' template lists (nvcc's host stubs reject class-type
// template arguments on __global__ functions).
template <PipeConfig Config>
struct Policy {
  static constexpr PipeConfig config = Config;
};

__host__ __device__ constexpr int block_threads(int threads_per_sequence) {
  return threads_per_sequence < 32 ? kPackedBlockThreads : threads_per_sequence;
}

template <typename T>
__host__ __device__ constexpr int items_per_vector() { return 16 / sizeof(T); }

// Whether the pipe loop issues the next tile's loads before scanning the current tile, so that their
// latency overlaps the scan. It holds a second tile in registers: worth it for 32- and 64-bit types
// (float32 backward 0.93 -> 0.95 of torch.add on an H100), not for 16-bit ones, whose 16 items a
// thread in float registers then cost occupancy (bfloat16 backward 0.94 -> 0.74).
template <typename T>
constexpr bool kPrefetch = sizeof(T) >= sizeof(float);

// Coefficients given as logs (log_coeffs) become the coefficients. Called under one branch per
// tile rather than per item, so that the exponentials are not evaluated when the flag is off.
template <typename Acc, int Items>
__device__ __forceinline__ void exponentiate(Acc (&coeff)[Items]) {
  if constexpr (!is_complex<Acc>::value) {
    #pragma unroll
    for (int i = 0; i < Items; ++i) coeff[i] = exp(coeff[i]);
  }
}

// What both pipe kernels share: the thread's sequence and rank in the sequence's segment, the order
// of the tiles, and the scan and memory primitives with their shared memory. ScanReverse is the
// direction of the scan this kernel runs (the backward runs against the forward op's direction).
template <typename T, PipeConfig Config, bool ScanReverse>
struct PipeThread {
  using Acc = accumulator_t<T>;
  static constexpr int kItems = items_per_vector<T>() * Config.vectors_per_thread;
  static constexpr int kTile = Config.threads_per_sequence * kItems;
  using Scan = TileScan<Config.threads_per_sequence, kItems, ScanReverse>;
  using IO = TileIO<T, Config.threads_per_sequence, block_threads(Config.threads_per_sequence), kItems, Config.access>;
  struct Storage {
    typename Scan::template Storage<Acc> scan;
    typename IO::Storage io;
  };

  typename Scan::template Storage<Acc>& scan_storage;
  const int rank;           // within the sequence's segment
  const bool active;        // false for threads past the last sequence, which still take part in the
                            // shuffles and barriers, with length 0
  const int64_t length;     // of this thread's row
  const int64_t num_tiles;  // per row
  const BatchIndex batch_row;  // of this thread's row (row 0 for inactive threads, which never access it)
  const IO io;

  __device__ __forceinline__ PipeThread(Storage& storage_, const SequenceLayout& layout)
      : scan_storage(storage_.scan),
        rank(threadIdx.x % Config.threads_per_sequence),
        active(sequence() < layout.num_rows()),
        length(active ? layout.seq_len : 0),
        num_tiles((layout.seq_len + kTile - 1) / kTile),
        batch_row(layout.shape.unravel(active ? sequence() : 0)),
        io(storage_.io, rank, threadIdx.x / Config.threads_per_sequence) {}

  __device__ __forceinline__ static int64_t sequence() {
    constexpr int kSequencesPerBlock = block_threads(Config.threads_per_sequence) / Config.threads_per_sequence;
    return static_cast<int64_t>(blockIdx.x) * kSequencesPerBlock + threadIdx.x / Config.threads_per_sequence;
  }

  // This thread's row of `operand`.
  template <typename Element = T>
  __device__ __forceinline__ Element* row(const Operand& operand) const {
    return operand.at<Element>(batch_row);
  }

  // The time stride of an operand this kernel reads: 1 at compile time, unless compiled for broadcast rows.
  __device__ __forceinline__ static auto time_stride(const Operand& operand) {
    if constexpr (Config.broadcast) return operand.time_stride;
    else return UnitStride{};
  }

  // fetch() of a row of `operand`.
  __device__ __forceinline__ void fetch(const Operand& operand, const T* row, int64_t step, Acc (&items)[kItems],
                                        Acc fill) const {
    io.fetch(row, time_stride(operand), tile_begin(step), length, items, fill);
  }

  // The first element of the tile the scan reaches at `step`.
  __device__ __forceinline__ int64_t tile_begin(int64_t step) const {
    return (ScanReverse ? num_tiles - 1 - step : step) * kTile;
  }

  __device__ __forceinline__ void scan(Acc (&value)[kItems], Acc (&coeff)[kItems], Acc& carry) const {
    Scan::scan(value, coeff, carry, rank, scan_storage);
  }
};

template <typename T, typename PolicyT>
__global__ void __launch_bounds__(block_threads(PolicyT::config.threads_per_sequence))
    pipe_forward_kernel(ForwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  using Thread = PipeThread<T, Config, Config.reverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const typename Thread::IO& io = thread.io;
  const int64_t length = thread.length;
  const T* inputs = thread.template row<const T>(params.inputs);
  const T* coeffs = thread.template row<const T>(params.coeffs);
  T* outputs = thread.row(params.outputs);
  const int64_t first = Config.reverse ? params.seq_len - 1 : 0;  // has no predecessor
  const bool has_initial = params.initial.data != nullptr;
  const Acc initial = has_initial && thread.active ? static_cast<Acc>(*thread.template row<const T>(params.initial)) : Acc(0);
  // Past the row's end, coefficients are the identity's: 1 (log 1 = 0 with log_coeffs).
  const Acc coeff_fill = params.log_coeffs ? Acc(0) : Acc(1);

  const int64_t num_tiles = thread.num_tiles;
  const auto fetch_tile = [&](int64_t step, Acc(&input_items)[kItems], Acc(&coeff_items)[kItems]) {
    thread.fetch(params.inputs, inputs, step, input_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, coeff_fill);
  };
  Acc value[kItems], coeff[kItems];
  if constexpr (kPrefetch<T>) fetch_tile(0, value, coeff);
  Acc carry = Acc(0);
  for (int64_t step = 0; step < num_tiles; ++step) {
    const int64_t tile_begin = thread.tile_begin(step);
    const int64_t begin = tile_begin + static_cast<int64_t>(thread.rank) * kItems;  // this thread's chunk
    if constexpr (!kPrefetch<T>) fetch_tile(step, value, coeff);
    io.arrange(value);
    io.arrange(coeff);
    // One uniform branch per tile for the flag, one for the single chunk holding the first element:
    // branches per item cost the loop a fifth of its speed.
    if (params.log_coeffs) exponentiate(coeff);
    if (begin <= first && first < begin + kItems) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (begin + i == first) {  // outputs[first] = coeffs[first] * initial + inputs[first]
          if (has_initial) value[i] = coeff[i] * initial + value[i];
          coeff[i] = Acc(0);  // without an initial state, whatever the coefficient (NaN and Inf too)
        }
      }
    }
    Acc next_value[kItems], next_coeff[kItems];
    if constexpr (kPrefetch<T>)
      if (step + 1 < num_tiles) fetch_tile(step + 1, next_value, next_coeff);
    thread.scan(value, coeff, carry);
    io.store(outputs, tile_begin, length, value);
    if constexpr (kPrefetch<T>) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i], coeff[i] = next_coeff[i];
    }
  }
}

// d_inputs[l] = conj(coeffs[next]) * d_inputs[next] + d_outputs[l], scanning against the forward
// op's direction, d_coeffs[l] = d_inputs[l] * conj(outputs[prev]) (outputs[prev] of the first element:
// initial, or none), times coeffs[l] with log_coeffs, and d_initial = conj(coeffs[first]) * d_inputs[first].
template <typename T, typename PolicyT>
__global__ void __launch_bounds__(block_threads(PolicyT::config.threads_per_sequence))
    pipe_backward_kernel(BackwardParams params) {
  constexpr PipeConfig Config = PolicyT::config;
  constexpr bool kForwardReverse = Config.reverse;
  using Thread = PipeThread<T, Config, !kForwardReverse>;
  using Acc = typename Thread::Acc;
  constexpr int kItems = Thread::kItems;
  __shared__ typename Thread::Storage storage;
  const Thread thread(storage, params);
  const typename Thread::IO& io = thread.io;
  const int64_t length = thread.length;
  const T* d_outputs = thread.template row<const T>(params.d_outputs);
  const T* coeffs = thread.template row<const T>(params.coeffs);
  const T* outputs = thread.template row<const T>(params.outputs);
  T* d_inputs = thread.row(params.d_inputs);
  T* d_coeffs = thread.row(params.d_coeffs);
  const int64_t first = kForwardReverse ? params.seq_len - 1 : 0;  // the forward op's first element
  const bool has_initial = params.initial.data != nullptr;
  const Acc initial = has_initial && thread.active ? static_cast<Acc>(*thread.template row<const T>(params.initial)) : Acc(0);
  T* const d_initial = has_initial && thread.active ? thread.row(params.d_initial) : nullptr;

  const int64_t num_tiles = thread.num_tiles;
  const int64_t rank_offset = static_cast<int64_t>(thread.rank) * kItems;
  // A tile needs its three chunks and, from the neighbouring chunks (L1 hits: the neighbour threads
  // load them too), the coefficient just after this thread's chunk and the output just before it,
  // in the forward direction. Past the row's end all values are 0: whatever coefficient is filled in
  // there only multiplies zeros.
  const auto fetch_tile = [&](int64_t step, Acc(&d_output_items)[kItems], Acc(&coeff_items)[kItems],
                              Acc(&output_items)[kItems], Acc& next_coeff_after, Acc& next_output_before) {
    thread.fetch(params.d_outputs, d_outputs, step, d_output_items, Acc(0));
    thread.fetch(params.coeffs, coeffs, step, coeff_items, Acc(0));
    thread.fetch(params.outputs, outputs, step, output_items, Acc(0));
    const int64_t begin = thread.tile_begin(step) + rank_offset;
    next_coeff_after = load_one(coeffs, Thread::time_stride(params.coeffs), kForwardReverse ? begin - 1 : begin + kItems, length, Acc(0));
    next_output_before = load_one(outputs, UnitStride{}, kForwardReverse ? begin + kItems : begin - 1, length, Acc(0));
  };

  Acc value[kItems], coeff[kItems], output[kItems], coeff_after, output_before;
  if constexpr (kPrefetch<T>) fetch_tile(0, value, coeff, output, coeff_after, output_before);
  Acc carry = Acc(0);
  Acc first_coeff = Acc(0);  // coeffs[first], kept by the thread whose chunk holds it for d_initial
  for (int64_t step = 0; step < num_tiles; ++step) {
    const int64_t tile_begin = thread.tile_begin(step);
    const int64_t begin = tile_begin + rank_offset;  // this thread's chunk
    if constexpr (!kPrefetch<T>) fetch_tile(step, value, coeff, output, coeff_after, output_before);
    io.arrange(value);
    io.arrange(coeff);
    io.arrange(output);
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
    const bool owns_first = begin <= first && first < begin + kItems;  // one chunk of one tile
    if (owns_first) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (begin + i == first) {
          prev_output[i] = conj(initial);
          first_coeff = coeff[i];
        }
      }
    }
    if (params.log_coeffs) {  // d/d(log c) = c * d/dc
      #pragma unroll
      for (int i = 0; i < kItems; ++i) prev_output[i] = prev_output[i] * coeff[i];
    }
    // coeff and output are consumed above: they take the next tile's values.
    Acc next_value[kItems];
    if constexpr (kPrefetch<T>)
      if (step + 1 < num_tiles) fetch_tile(step + 1, next_value, coeff, output, coeff_after, output_before);
    thread.scan(value, shifted_coeff, carry);
    #pragma unroll
    for (int i = 0; i < kItems; ++i) prev_output[i] = value[i] * prev_output[i];
    if (owns_first) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (begin + i == first) {
          if (d_initial != nullptr) *d_initial = static_cast<T>(conj(first_coeff) * value[i]);
          if (!has_initial) prev_output[i] = Acc(0);  // no predecessor: the coefficient takes no part
        }
      }
    }
    io.store(d_inputs, tile_begin, length, value);
    io.store(d_coeffs, tile_begin, length, prev_output);
    if constexpr (kPrefetch<T>) {
      #pragma unroll
      for (int i = 0; i < kItems; ++i) value[i] = next_value[i];
    }
  }
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

// The config forced in the params, else the smallest tile that holds the whole sequence, else the
// largest tile, looping over tiles. Vectorized access where every row of every operand is aligned;
// the broadcast config where an operand is broadcast along time.
template <typename T>
PipeConfig choose_config(const SequenceLayout& layout, std::initializer_list<Operand> operands) {
  PipeConfig config{kTileShapes.back()[0], kTileShapes.back()[1], layout.reverse, Access::Vectorized};
  bool broadcast = false;
  for (const Operand& operand : operands) broadcast = broadcast || operand.time_stride == 0;
  if (broadcast) {
    config.threads_per_sequence = kBroadcastTileShape[0];
    config.vectors_per_thread = kBroadcastTileShape[1];
    config.access = Access::Staged;
    config.broadcast = true;
    return config;
  }
  if (layout.threads_per_sequence > 0) {
    config.threads_per_sequence = layout.threads_per_sequence;
    config.vectors_per_thread = layout.vectors_per_thread;
  } else {
    for (const auto& [threads, vectors] : kTileShapes) {
      if (static_cast<int64_t>(threads) * vectors * items_per_vector<T>() >= layout.seq_len) {
        config.threads_per_sequence = threads;
        config.vectors_per_thread = vectors;
        break;
      }
    }
  }
  bool aligned = layout.seq_len * static_cast<int64_t>(sizeof(T)) % 16 == 0;
  for (const Operand& operand : operands) aligned = aligned && rows_aligned<T>(layout, operand);
  config.access = aligned ? Access::Vectorized : Access::Staged;
  return config;
}

template <PipeConfig Config>
dim3 grid_for(int64_t num_rows) {
  constexpr int kSequencesPerBlock = block_threads(Config.threads_per_sequence) / Config.threads_per_sequence;
  return dim3(static_cast<unsigned>((num_rows + kSequencesPerBlock - 1) / kSequencesPerBlock));
}

bool contiguous_in_time(const Operand& operand) { return operand.time_stride == 1; }
bool readable_in_time(const Operand& operand) { return operand.time_stride == 1 || operand.time_stride == 0; }

}  // namespace

bool pipe_supports(const ForwardParams& params) {
  return params.cu_seqlens == nullptr && readable_in_time(params.inputs) && readable_in_time(params.coeffs) &&
         contiguous_in_time(params.outputs);
}

bool pipe_supports(const BackwardParams& params) {
  return params.cu_seqlens == nullptr && readable_in_time(params.d_outputs) && readable_in_time(params.coeffs) &&
         contiguous_in_time(params.outputs) && contiguous_in_time(params.d_inputs) &&
         contiguous_in_time(params.d_coeffs);
}

void launch_pipe_forward(const ForwardParams& params, cudaStream_t stream) {
  dispatch_dtype<__half, __nv_bfloat16>(params.dtype, [&]<typename T>() {
    const PipeConfig config = choose_config<T>(params, {params.inputs, params.coeffs, params.outputs});
    dispatch_config<kPipeConfigs>(config, [&]<PipeConfig Config>() {
      pipe_forward_kernel<T, Policy<Config>>
          <<<grid_for<Config>(params.num_rows()), block_threads(Config.threads_per_sequence), 0, stream>>>(params);
    });
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

void launch_pipe_backward(const BackwardParams& params, cudaStream_t stream) {
  dispatch_dtype<__half, __nv_bfloat16>(params.dtype, [&]<typename T>() {
    const PipeConfig config = choose_config<T>(
        params, {params.d_outputs, params.coeffs, params.outputs, params.d_inputs, params.d_coeffs});
    dispatch_config<kPipeConfigs>(config, [&]<PipeConfig Config>() {
      pipe_backward_kernel<T, Policy<Config>>
          <<<grid_for<Config>(params.num_rows()), block_threads(Config.threads_per_sequence), 0, stream>>>(params);
    });
  });
  LINREC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace linrec
