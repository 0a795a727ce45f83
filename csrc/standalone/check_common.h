// What the standalone checks share (check_kernels.cu, check_selective_scan.cu): device buffers
// poisoned with NaN before a kernel writes them, their transfers, the reference's wide types and the
// comparison against the reference. Torch-free.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include "linrec/cuda_launch.h"  // LINREC_CUDA_CHECK
#include "linrec/dispatch.h"
#include "linrec/numeric.h"

namespace linrec::standalone {

using linrec::Complex;
using linrec::DType;

struct CudaFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};

template <typename T>
struct DeviceBuffer {
  std::unique_ptr<T, CudaFree> pointer;
  size_t count;
  T* get() const { return pointer.get(); }
};

template <typename T>
DeviceBuffer<T> allocate(size_t count) {
  T* pointer = nullptr;
  LINREC_CUDA_CHECK(cudaMalloc(&pointer, (count + 1) * sizeof(T)));  // +1: never a zero-byte allocation
  LINREC_CUDA_CHECK(cudaMemset(pointer, 0xFF, (count + 1) * sizeof(T)));  // all-ones bits: NaN in every float type
  return {std::unique_ptr<T, CudaFree>(pointer), count};
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> device = allocate<T>(host.size());
  LINREC_CUDA_CHECK(cudaMemcpy(device.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

// The reference's type: double, or complex double.
template <typename T>
using Wide = std::conditional_t<linrec::is_complex<T>::value, Complex<double>, double>;

template <typename T>
Wide<T> widen(const T& value) {
  if constexpr (linrec::is_complex<T>::value) return {double(value.re), double(value.im)};
  else if constexpr (std::is_same_v<T, double>) return value;
  else return static_cast<double>(static_cast<float>(value));  // 16-bit types convert through float
}

template <typename T>
std::vector<Wide<T>> download(const DeviceBuffer<T>& device) {
  std::vector<T> host(device.count);
  LINREC_CUDA_CHECK(cudaMemcpy(host.data(), device.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<Wide<T>> wide;
  for (const T& value : host) wide.push_back(widen(value));
  return wide;
}

inline double magnitude(double value) { return std::fabs(value); }
inline double magnitude(Complex<double> value) { return std::hypot(value.re, value.im); }
inline Complex<double> difference(Complex<double> a, Complex<double> b) { return {a.re - b.re, a.im - b.im}; }
inline double difference(double a, double b) { return a - b; }

inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float64: case DType::Complex128: return 1e-12;
    case DType::Float32: case DType::Complex64: return 2e-5;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
  }
  return 0;
}

// max |actual - expected| / max |expected| within `bound` (the dtype's tolerance by default); NaN
// anywhere in actual fails.
template <typename W>
bool matches(const char* what, const std::vector<W>& actual, const std::vector<W>& expected, DType dtype,
             double bound = 0.0) {
  if (bound == 0.0) bound = tolerance(dtype);
  double max_error = 0, scale = 1e-30;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = magnitude(difference(actual[i], expected[i]));
    if (!std::isfinite(error)) {
      std::printf("  %s: element %zu is not finite\n", what, i);
      return false;
    }
    max_error = std::fmax(max_error, error);
    scale = std::fmax(scale, magnitude(expected[i]));
  }
  if (max_error / scale <= bound) return true;
  std::printf("  %s: max error / max |ref| = %.3g > %.3g\n", what, max_error / scale, bound);
  return false;
}

// Plans the call and launches it with the workspace the plan asks for, zeroed, as the op layer does
// (params.workspace is set); returns the plan.
template <typename Params>
auto launch_with_workspace(Params& params) {
  const auto plan = linrec::cuda::make_plan(params);
  auto workspace = allocate<char>(plan.workspace_bytes);
  LINREC_CUDA_CHECK(cudaMemset(workspace.get(), 0, plan.workspace_bytes));
  params.workspace = plan.workspace_bytes > 0 ? workspace.get() : nullptr;
  linrec::cuda::launch(plan, params, nullptr);
  LINREC_CUDA_CHECK(cudaDeviceSynchronize());  // before the workspace is freed
  return plan;
}

}  // namespace linrec::standalone
