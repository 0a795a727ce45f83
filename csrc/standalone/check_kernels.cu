// Torch-free check of the CUDA kernels, for compute-sanitizer, ncu and cuda-gdb:
//   linrec_check_kernels [max_length]
// Runs forward and backward for every dtype, both directions and a set of odd shapes on
// NaN-poisoned outputs, compares with the sequential recurrence on the host in double precision
// and exits non-zero on any mismatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "linrec/cuda_launch.h"
#include "linrec/dispatch.h"
#include "linrec/sequential_scan.h"

namespace {

using linrec::DType;

struct CudaFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};

template <typename T>
using DeviceBuffer = std::unique_ptr<T, CudaFree>;

template <typename T>
DeviceBuffer<T> allocate(size_t count) {
  T* pointer = nullptr;
  LINREC_CUDA_CHECK(cudaMalloc(&pointer, (count + 1) * sizeof(T)));  // +1: never a zero-byte allocation
  return DeviceBuffer<T>(pointer);
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> device = allocate<T>(host.size());
  LINREC_CUDA_CHECK(cudaMemcpy(device.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

template <typename T>
DeviceBuffer<T> poisoned(size_t count) {
  DeviceBuffer<T> device = allocate<T>(count);
  LINREC_CUDA_CHECK(cudaMemset(device.get(), 0xFF, count * sizeof(T)));  // all-ones bits: NaN in every float type
  return device;
}

template <typename T>
std::vector<double> download(const DeviceBuffer<T>& device, size_t count) {
  std::vector<T> host(count);
  LINREC_CUDA_CHECK(cudaMemcpy(host.data(), device.get(), count * sizeof(T), cudaMemcpyDeviceToHost));
  return std::vector<double>(host.begin(), host.end());
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 2e-5;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
  }
  return 0;
}

// max |actual - expected| / max |expected|; NaN anywhere in actual fails.
bool matches(const char* what, const std::vector<double>& actual, const std::vector<double>& expected, DType dtype) {
  double max_error = 0, scale = 1e-30;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) {
      std::printf("  %s: element %zu is %f\n", what, i, actual[i]);
      return false;
    }
    max_error = std::fmax(max_error, std::fabs(actual[i] - expected[i]));
    scale = std::fmax(scale, std::fabs(expected[i]));
  }
  if (max_error / scale <= tolerance(dtype)) return true;
  std::printf("  %s: max error / max |ref| = %.3g > %.3g\n", what, max_error / scale, tolerance(dtype));
  return false;
}

template <typename T>
bool check_case(DType dtype, int64_t num_sequences, int64_t seq_len, bool reverse, std::mt19937& rng) {
  const size_t count = static_cast<size_t>(num_sequences * seq_len);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> inputs(count), coeffs(count), d_outputs(count);
  for (size_t i = 0; i < count; ++i) {
    inputs[i] = static_cast<T>(normal(rng));
    coeffs[i] = static_cast<T>(uniform(rng));
    d_outputs[i] = static_cast<T>(normal(rng));
  }
  // Host reference in double from the same rounded values.
  const std::vector<double> x(inputs.begin(), inputs.end()), c(coeffs.begin(), coeffs.end()),
      dy(d_outputs.begin(), d_outputs.end());
  std::vector<double> y(count), dx(count), dc(count);
  for (int64_t s = 0; s < num_sequences; ++s) {
    const int64_t o = s * seq_len;
    linrec::sequential_scan_forward(&x[o], &c[o], &y[o], seq_len, reverse);
    linrec::sequential_scan_backward(&dy[o], &c[o], &y[o], &dx[o], &dc[o], seq_len, reverse);
  }

  auto device_inputs = upload(inputs), device_coeffs = upload(coeffs), device_d_outputs = upload(d_outputs);
  auto device_outputs = poisoned<T>(count), device_d_inputs = poisoned<T>(count), device_d_coeffs = poisoned<T>(count);
  linrec::ForwardParams forward;
  forward.num_sequences = num_sequences;
  forward.seq_len = seq_len;
  forward.reverse = reverse;
  forward.dtype = dtype;
  forward.inputs = device_inputs.get();
  forward.coeffs = device_coeffs.get();
  forward.outputs = device_outputs.get();
  linrec::cuda::launch_forward(forward, nullptr);

  linrec::BackwardParams backward;
  static_cast<linrec::SequenceLayout&>(backward) = forward;
  backward.d_outputs = device_d_outputs.get();
  backward.coeffs = device_coeffs.get();
  backward.outputs = device_outputs.get();
  backward.d_inputs = device_d_inputs.get();
  backward.d_coeffs = device_d_coeffs.get();
  linrec::cuda::launch_backward(backward, nullptr);
  LINREC_CUDA_CHECK(cudaDeviceSynchronize());

  const bool ok = matches("outputs", download(device_outputs, count), y, dtype) &&
                  matches("d_inputs", download(device_d_inputs, count), dx, dtype) &&
                  matches("d_coeffs", download(device_d_coeffs, count), dc, dtype);
  std::printf("%-4s %-8s %7lld x %-7lld %s\n", ok ? "ok" : "FAIL", linrec::dtype_name(dtype),
              static_cast<long long>(num_sequences), static_cast<long long>(seq_len), reverse ? "reverse" : "forward");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_length = argc > 1 ? std::stoll(argv[1]) : 4097;
  std::mt19937 rng(std::random_device{}());
  bool all_ok = true;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    for (int64_t seq_len : {int64_t(1), int64_t(2), int64_t(31), int64_t(33), int64_t(1000), max_length})
      for (bool reverse : {false, true})
        linrec::dispatch_dtype<__half, __nv_bfloat16>(dtype, [&]<typename T>() {
          all_ok &= check_case<T>(dtype, 131, seq_len, reverse, rng);
        });
  std::printf("%s (targets: %s)\n", all_ok ? "all cases match" : "MISMATCHES", linrec::cuda::compiled_targets());
  return all_ok ? 0 : 1;
}
