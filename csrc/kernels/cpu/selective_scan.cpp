// The selective-scan ops on the CPU, spread over the intra-op pool: a real float32 state in vectors of
// channels (ssm/lanes.h), one run of up to a vector's lanes of channels per forward task; any other
// state (complex, float64) one (batch row, channel) at a time (ssm/sequential.h). The backward's tasks
// keep the channels sharing a varying B or C group together, so that their gradient terms add up in a
// fixed order (deterministic, without atomics).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <numeric>

#include "linrec/cpu/isa.h"
#include "linrec/dispatch.h"
#include "linrec/ssm/lanes.h"
#include "linrec/ssm/ops.h"
#include "linrec/ssm/sequential.h"

namespace linrec::ssm {
namespace {

// Calls body.template operator()<T, S>() for the call's element type T and state type S (real, or
// complex beside a complex A): dispatch_scan_types' T and S (the CPU reads B and C in either dtype).
template <typename Body>
void dispatch_values(const ForwardParams& params, Body&& body) {
  dispatch_scan_types<c10::Half, c10::BFloat16>(params.dtype, params.state_dtype, false,
                                                [&]<typename T, typename W, typename S>() {
                                                  body.template operator()<T, S>();
                                                });
}

// The lanes' vectors: at most 32 bytes (8 float32 channels), also under AVX-512, whose 64-byte vectors
// took 1.3 to 1.7 times as long (docs/design.md, Fused selective scan, CPU).
constexpr int lane_bytes(int vector_bytes) { return vector_bytes < lanes::kMaxBytes ? vector_bytes : lanes::kMaxBytes; }
int64_t float_lanes(cpu::Isa isa) {
  return lane_bytes(isa == cpu::Isa::Avx512 ? 64 : isa == cpu::Isa::Avx2 ? 32 : 16) / static_cast<int>(sizeof(float));
}

void forward_cpu(const ForwardParams& params, const Tensor&) {
  if (params.d == 0) return;  // every output is empty
  if (lanes::takes(params)) {
    const cpu::Isa isa = cpu::cpu_isa();
    const lanes::Runs runs(params, float_lanes(isa));
    dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
      if constexpr (std::is_same_v<accumulator_t<T>, float>) {
        torch::stable::parallel_for(0, params.batch * runs.per_row, 1, [&](int64_t begin, int64_t end) {
          lanes::ForwardBuffers buffers(params);
          for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / runs.per_row, r = task % runs.per_row;
            cpu::with_vector_width(isa, [&]<int Bytes>() {
              lanes::forward<T, lane_bytes(Bytes)>(params, b, runs.first(r), runs.count(r), buffers);
            });
          }
        });
      }
    });
    return;
  }
  dispatch_values(params, [&]<typename T, typename S>() {
    torch::stable::parallel_for(0, params.batch * params.d, 1, [&](int64_t begin, int64_t end) {
      sequential::ForwardBuffers<T, S> buffers(params);
      for (int64_t row = begin; row < end; ++row)
        sequential::forward_row<T, S>(params, row / params.d, row % params.d, buffers);
    });
  });
}

// Channels per backward task: a whole number of the groups of every varying projection.
int64_t channels_per_task(const BackwardParams& params) {
  int64_t groups = params.d;
  for (const Projection* M : {&params.B, &params.C})
    if (M->varying) groups = std::gcd(groups, M->groups);
  return params.d / groups;
}

// The lanes' backward: without a varying projection, a task per run of channels (as the forward's);
// with one, a task per whole groups (channels_per_task), each run of them in turn.
void backward_lanes(const BackwardParams& params) {
  const cpu::Isa isa = cpu::cpu_isa();
  const lanes::Runs runs(params, float_lanes(isa));
  const bool varying = params.B.varying || params.C.varying;
  const int64_t runs_per_task = varying ? channels_per_task(params) / runs.unit * runs.per_unit : 1;
  const int64_t tasks_per_row = runs.per_row / runs_per_task;
  dispatch_dtype<c10::Half, c10::BFloat16>(params.dtype, [&]<typename T>() {
    if constexpr (std::is_same_v<accumulator_t<T>, float>) {
      torch::stable::parallel_for(0, params.batch * tasks_per_row, 1, [&](int64_t begin, int64_t end) {
        lanes::BackwardBuffers buffers(params);
        for (int64_t task = begin; task < end; ++task) {
          const int64_t b = task / tasks_per_row, first = task % tasks_per_row * runs_per_task;
          for (int64_t r = first; r < first + runs_per_task; ++r)
            cpu::with_vector_width(isa, [&]<int Bytes>() {
              lanes::backward<T, lane_bytes(Bytes)>(params, b, runs.first(r), runs.count(r), buffers);
            });
        }
      });
    }
  });
}

void backward_cpu(const BackwardParams& params, const Tensor&) {
  if (params.d == 0) return;  // every gradient is empty, or zeroed beforehand (varying B and C)
  if (lanes::takes(params)) return backward_lanes(params);
  const int64_t channels = channels_per_task(params), tasks_per_row = params.d / channels;
  dispatch_values(params, [&]<typename T, typename S>() {
    torch::stable::parallel_for(0, params.batch * tasks_per_row, 1, [&](int64_t begin, int64_t end) {
      sequential::BackwardBuffers<T, S> buffers(params);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / tasks_per_row, first = task % tasks_per_row * channels;
        for (int64_t k = first; k < first + channels; ++k) sequential::backward_row<T, S>(params, b, k, buffers);
      }
    });
  });
}

}  // namespace
}  // namespace linrec::ssm

STABLE_TORCH_LIBRARY_IMPL(linrec, CPU, m) {
  using namespace linrec::ssm;
  m.impl("selective_scan_forward", TORCH_BOX(&forward_op<forward_cpu>));
  m.impl("selective_scan_backward", TORCH_BOX(&backward_op<backward_cpu>));
  m.impl("selective_state_update", TORCH_BOX((&state_update_op<ForwardParams, forward_cpu>)));
}
