// The current device's compute capability (major) and SM count, which the plans of every kernel
// family read on each call: queried once per device, then read from a cache. Host-only.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "linrec/cuda_launch.h"

namespace linrec::cuda {

struct DeviceShape {
  int major = 0, multiprocessors = 0;
};

inline DeviceShape device_shape() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known_major[kMaxDevices] = {}, known_count[kMaxDevices] = {};
  int device = 0;
  LINREC_CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && known_count[device].load(std::memory_order_relaxed) > 0)
    return {known_major[device].load(std::memory_order_relaxed), known_count[device].load(std::memory_order_relaxed)};
  DeviceShape shape;
  LINREC_CUDA_CHECK(cudaDeviceGetAttribute(&shape.major, cudaDevAttrComputeCapabilityMajor, device));
  LINREC_CUDA_CHECK(cudaDeviceGetAttribute(&shape.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  if (cached) {
    known_major[device].store(shape.major, std::memory_order_relaxed);
    known_count[device].store(shape.multiprocessors, std::memory_order_relaxed);
  }
  return shape;
}

}  // namespace linrec::cuda
