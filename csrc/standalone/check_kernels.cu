// Torch-free check of the CUDA kernels, for compute-sanitizer, ncu and cuda-gdb:
//   linrec_check_kernels [max_length [dtype]]      (dtype: float32, bfloat16, ...; default: every one)
// Runs forward and backward for every dtype, both directions, a set of odd lengths and the layouts
// and features the kernels branch on (contiguous rows, channels-innermost strides, broadcast
// coefficients, initial states, packed sequences, log coefficients, few long sequences chained
// across blocks; on sm_90 and newer, channels-innermost layouts with 16-byte aligned time steps take
// the bulk family, the others the pipe family, and each line names the family) on NaN-poisoned outputs,
// compares with the sequential recurrence on the host in double precision (the same
// sequential_scan.h code, on the same strides) and exits non-zero on any mismatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"
#include "linrec/sequential_scan.h"
#include "check_common.h"

namespace {

using namespace linrec::standalone;

// Inputs ~ N(0, 1); coefficients ~ U(-0.7, 0.7) (|c| < 1 in complex too), or their logs in (-1.5, -0.1).
template <typename T>
T random_value(std::mt19937& rng, bool coefficient, bool log_coefficient = false) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const auto draw = [&] {
    if (log_coefficient) return uniform(rng) * 0.7 - 0.8;
    return coefficient ? uniform(rng) * 0.7 : normal(rng);
  };
  if constexpr (linrec::is_complex<T>::value) {
    using Real = decltype(T{}.re);
    return T(static_cast<Real>(draw()), static_cast<Real>(draw()));
  } else {
    return static_cast<T>(draw());
  }
}

struct Case {
  int64_t rows, seq_len;
  bool reverse;
  bool channels_innermost = false;  // (time, rows) memory: the strided kernels' coalesced layout
  bool broadcast_coeffs = false;    // one coefficient per row, time stride 0
  bool initial = false;
  int64_t packed = 1;               // > 1: that many packed sequences (cu_seqlens), uneven lengths
  bool log_coeffs = false;
};

// The operands of one case, as host vectors of type U (T for the device, Wide<T> for the reference).
template <typename U>
struct Operands {
  std::vector<U> inputs, coeffs, initial, d_outputs;
};

linrec::Operand full(const Case& c, void* data) {
  linrec::Operand operand{data};
  operand.time_stride = c.channels_innermost ? c.rows : 1;
  operand.strides[0] = c.channels_innermost ? 1 : c.seq_len;
  return operand;
}

linrec::Operand coefficients(const Case& c, void* data) {
  if (!c.broadcast_coeffs) return full(c, data);
  linrec::Operand operand{data};
  operand.strides[0] = 1;
  return operand;
}

linrec::Operand state(const Case& c, void* data) {
  linrec::Operand operand{data};
  operand.strides[0] = 1;
  operand.segment_stride = c.rows;
  return operand;
}

// Where one run's operands live (host vectors for the reference, device buffers for the kernels).
struct Buffers {
  const int64_t* offsets;
  void *inputs, *coeffs, *initial, *d_outputs, *outputs, *d_inputs, *d_coeffs, *d_initial;
};

// The params of the case over `buffers`: strides from the case, pointers from the buffers.
void build_params(const Case& c, const Buffers& buffers, linrec::ForwardParams& forward,
                  linrec::BackwardParams& backward) {
  forward.shape = linrec::BatchShape::of(&c.rows, 1);
  forward.seq_len = c.seq_len;
  forward.reverse = c.reverse;
  forward.log_coeffs = c.log_coeffs;
  if (c.packed > 1) {
    forward.cu_seqlens = buffers.offsets;
    forward.cu_seqlens_int64 = true;
    forward.num_segments = c.packed;
  }
  forward.inputs = full(c, buffers.inputs);
  forward.coeffs = coefficients(c, buffers.coeffs);
  forward.outputs = full(c, buffers.outputs);
  if (c.initial) forward.initial = state(c, buffers.initial);
  static_cast<linrec::SequenceLayout&>(backward) = forward;
  backward.d_outputs = full(c, buffers.d_outputs);
  backward.coeffs = forward.coeffs;
  backward.outputs = forward.outputs;
  backward.initial = forward.initial;
  backward.d_inputs = full(c, buffers.d_inputs);
  backward.d_coeffs = full(c, buffers.d_coeffs);
  if (c.initial) backward.d_initial = state(c, buffers.d_initial);
}

template <typename T>
bool check_case(DType dtype, const Case& c, std::mt19937& rng) {
  using W = Wide<T>;
  const size_t count = static_cast<size_t>(c.rows * c.seq_len);
  const size_t states = static_cast<size_t>(c.rows * c.packed);
  std::vector<int64_t> offsets{0};  // uneven packed lengths, the last one taking the rest
  for (int64_t s = 1; s < c.packed; ++s) offsets.push_back(std::min(c.seq_len, offsets.back() + (s * 7) % 13));
  offsets.push_back(c.seq_len);

  Operands<T> in;
  for (size_t i = 0; i < count; ++i) in.inputs.push_back(random_value<T>(rng, false));
  for (size_t i = 0; i < (c.broadcast_coeffs ? size_t(c.rows) : count); ++i) in.coeffs.push_back(random_value<T>(rng, true, c.log_coeffs));
  for (size_t i = 0; i < states; ++i) in.initial.push_back(random_value<T>(rng, false));
  for (size_t i = 0; i < count; ++i) in.d_outputs.push_back(random_value<T>(rng, false));

  Operands<W> wide;
  for (const T& v : in.inputs) wide.inputs.push_back(widen(v));
  for (const T& v : in.coeffs) wide.coeffs.push_back(widen(v));
  for (const T& v : in.initial) wide.initial.push_back(widen(v));
  for (const T& v : in.d_outputs) wide.d_outputs.push_back(widen(v));
  std::vector<W> outputs(count), d_inputs(count), d_coeffs(count), d_initial(states);
  linrec::ForwardParams forward;
  linrec::BackwardParams backward;
  build_params(c, {offsets.data(), wide.inputs.data(), wide.coeffs.data(), wide.initial.data(), wide.d_outputs.data(),
                   outputs.data(), d_inputs.data(), d_coeffs.data(), d_initial.data()},
               forward, backward);
  for (int64_t segment = 0; segment < c.packed; ++segment)  // the host reference, sequential_scan.h
    for (int64_t row = 0; row < c.rows; ++row) {
      const int64_t rows[1] = {row};
      linrec::sequential_scan_forward<1, W>(forward, rows, segment);
      linrec::sequential_scan_backward<1, W>(backward, rows, segment);
    }

  auto device_offsets = upload(offsets);
  auto device_inputs = upload(in.inputs), device_coeffs = upload(in.coeffs), device_initial = upload(in.initial);
  auto device_d_outputs = upload(in.d_outputs);
  auto device_outputs = allocate<T>(count), device_d_inputs = allocate<T>(count), device_d_coeffs = allocate<T>(count);
  auto device_d_initial = allocate<T>(states);
  LINREC_CUDA_CHECK(cudaMemset(device_d_initial.get(), 0, states * sizeof(T)));  // as the op layer allocates it
  build_params(c, {device_offsets.get(), device_inputs.get(), device_coeffs.get(), device_initial.get(),
                   device_d_outputs.get(), device_outputs.get(), device_d_inputs.get(), device_d_coeffs.get(),
                   device_d_initial.get()},
               forward, backward);
  forward.dtype = backward.dtype = dtype;
  forward.coeff_dtype = backward.coeff_dtype = dtype;
  const linrec::Family family = launch_with_workspace(forward).family;
  launch_with_workspace(backward);
  LINREC_CUDA_CHECK(cudaDeviceSynchronize());

  bool ok = matches("outputs", download(device_outputs), outputs, dtype) &&
            matches("d_inputs", download(device_d_inputs), d_inputs, dtype) &&
            matches("d_coeffs", download(device_d_coeffs), d_coeffs, dtype);
  if (c.initial) ok = ok && matches("d_initial", download(device_d_initial), d_initial, dtype);
  std::printf("%-4s %-4s %-10s %5lld x %-7lld %-7s%s%s%s%s%s\n", ok ? "ok" : "FAIL",
              family == linrec::Family::Bulk ? "bulk" : "pipe", linrec::dtype_name(dtype),
              static_cast<long long>(c.rows), static_cast<long long>(c.seq_len), c.reverse ? "reverse" : "forward",
              c.channels_innermost ? " channels-innermost" : "", c.broadcast_coeffs ? " broadcast-coeffs" : "",
              c.initial ? " initial" : "", c.packed > 1 ? " packed" : "", c.log_coeffs ? " log-coeffs" : "");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_length = argc > 1 ? std::stoll(argv[1]) : 4097;
  const std::string only = argc > 2 ? argv[2] : "";
  std::mt19937 rng(std::random_device{}());
  bool all_ok = true;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Complex64, DType::Complex128})
    linrec::dispatch_dtype<__half, __nv_bfloat16>(dtype, [&]<typename T>() {
      if (!only.empty() && only != linrec::dtype_name(dtype)) return;
      for (bool reverse : {false, true}) {
        for (int64_t seq_len : {int64_t(1), int64_t(2), int64_t(31), int64_t(33), int64_t(1000), max_length})
          all_ok &= check_case<T>(dtype, Case{131, seq_len, reverse}, rng);
        // The branches of the pipe kernels: initial, broadcast coefficients, channels innermost, packed
        // sequences (empty ones included) along contiguous and strided time.
        all_ok &= check_case<T>(dtype, Case{67, 1001, reverse, false, true, true}, rng);
        all_ok &= check_case<T>(dtype, Case{67, 301, reverse, true, false, true}, rng);
        all_ok &= check_case<T>(dtype, Case{33, 301, reverse, true, true, true, 9}, rng);
        all_ok &= check_case<T>(dtype, Case{33, 3001, reverse, false, false, true, 300}, rng);
        // Chained across blocks (few rows): time-contiguous with more chunks than one look-back window,
        // unaligned (staged) and 16-byte aligned with a partial last chunk (coalesced or vectorized),
        // strided with a partial group of channels, and strided many channels (piped).
        all_ok &= check_case<T>(dtype, Case{2, 100001, reverse, false, false, true}, rng);
        all_ok &= check_case<T>(dtype, Case{2, 100008, reverse, false, false, true}, rng);
        all_ok &= check_case<T>(dtype, Case{40, 5001, reverse, true, false, true}, rng);
        all_ok &= check_case<T>(dtype, Case{9000, 129, reverse, true}, rng);
        // Channels innermost with 16-byte aligned steps (the bulk family on sm_90 and newer): packed with
        // initial states, and a partial tile of 32 channels over several chunks.
        all_ok &= check_case<T>(dtype, Case{72, 1001, reverse, true, false, true, 9}, rng);
        all_ok &= check_case<T>(dtype, Case{40, 777, reverse, true}, rng);
        if constexpr (!linrec::is_complex<T>::value) {
          all_ok &= check_case<T>(dtype, Case{67, 1001, reverse, false, false, false, 1, true}, rng);
          all_ok &= check_case<T>(dtype, Case{72, 1001, reverse, true, false, true, 1, true}, rng);
        }
      }
    });
  std::printf("%s (targets: %s)\n", all_ok ? "all cases match" : "MISMATCHES", linrec::cuda::compiled_targets());
  return all_ok ? 0 : 1;
}
