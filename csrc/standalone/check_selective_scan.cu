// Torch-free check of the fused selective scan's CUDA kernels, for compute-sanitizer, ncu and cuda-gdb:
//   linrec_check_selective_scan [dtype]      (dtype: float32 or bfloat16; default: both)
// Runs forward and backward on NaN-poisoned outputs for calls that reach each kernel: every lane policy
// (one state dim a lane at n <= 4, four up to 16, sixteen lanes up to 64, the forward's blocks of eight
// warps, sixteen lanes of one dim for few channels), B and C varying or fixed, packed sequences with an
// empty one, rows split along time, the deterministic backward, and the block kernels (B fixed beside C
// varying, n > 64). Compares every output and gradient with the CPU's sequential family in double
// precision (ssm/sequential.h, selective_scan_reference.cpp) over the same params and exits non-zero on
// any mismatch.
#include <cuda_bf16.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check_common.h"
#include "linrec/cuda_launch.h"
#include "selective_scan_reference.h"

namespace {

using namespace linrec::standalone;
namespace ssm = linrec::ssm;

struct Case {
  const char* name;
  int64_t batch, d, n, length;
  const char* B;  // "fixed" (d, n), or varying with this many groups: "1", "2"
  const char* C;
  bool initial = false;
  std::vector<int64_t> offsets = {};  // packed sequences (batch 1)
  bool deterministic = false;
};

bool fixed(const char* layout) { return std::string(layout) == "fixed"; }

// One case's tensors, as host vectors of V (the reference's double) or device buffers: the per-step
// values in T, the others in float (the state type).
template <typename V>
struct Tensors {
  V *u, *delta, *z, *A, *B, *C, *D, *delta_bias, *initial, *d_out, *d_last_state;
  V *out, *checkpoints, *last_state;
  V *d_u, *d_delta, *d_z, *d_A, *d_B, *d_C, *d_D, *d_delta_bias, *d_initial;
  const int64_t* offsets;
};

struct Sizes {
  int64_t steps, sequences, chunks, states, projection_B, projection_C, d_projection_B, d_projection_C;
  explicit Sizes(const Case& c)
      : steps(c.batch * c.d * c.length), sequences(c.offsets.empty() ? c.batch : int64_t(c.offsets.size()) - 1),
        chunks(ssm::chunks_of(c.length)), states(sequences * c.d * c.n),
        projection_B(projection(c, c.B)), projection_C(projection(c, c.C)),
        d_projection_B(fixed(c.B) ? c.batch * c.d * c.n : projection_B),
        d_projection_C(fixed(c.C) ? c.batch * c.d * c.n : projection_C) {}
  static int64_t projection(const Case& c, const char* layout) {
    return fixed(layout) ? c.d * c.n : c.batch * std::stoll(layout) * c.n * c.length;
  }
};

ssm::Projection projection(const Case& c, const char* layout, const void* data) {
  ssm::Projection M;
  M.data = data;
  M.varying = !fixed(layout);
  M.groups = M.varying ? std::stoll(layout) : 1;
  return M;
}

// The params of the case over `t`; dtype: T's (the reference's: Float64).
template <typename V>
ssm::BackwardParams params_of(const Case& c, const Tensors<V>& t, DType dtype, int64_t value_bytes) {
  ssm::BackwardParams p;
  p.dtype = dtype;
  p.state_dtype = dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  p.batch = c.batch, p.d = c.d, p.n = c.n, p.length = c.length;
  p.u = t.u, p.delta = t.delta, p.z = t.z, p.A = t.A, p.D = t.D, p.delta_bias = t.delta_bias;
  p.B = projection(c, c.B, t.B);
  p.C = projection(c, c.C, t.C);
  p.delta_softplus = true;
  p.vectorized = c.length * value_bytes % 16 == 0;
  p.initial = c.initial ? t.initial : nullptr;
  p.sequences.count = c.offsets.empty() ? c.batch : int64_t(c.offsets.size()) - 1;
  p.sequences.length = c.length;
  if (!c.offsets.empty()) {
    p.sequences.cu_seqlens = t.offsets;
    p.sequences.offsets_int64 = true;
  }
  p.out = t.out, p.checkpoints = t.checkpoints, p.last_state = t.last_state;
  p.d_out = t.d_out, p.d_last_state = t.d_last_state, p.saved_checkpoints = t.checkpoints;
  p.d_u = t.d_u, p.d_delta = t.d_delta, p.d_z = t.d_z, p.d_A = t.d_A, p.d_B = t.d_B, p.d_C = t.d_C;
  p.d_D = t.d_D, p.d_delta_bias = t.d_delta_bias, p.d_initial = c.initial ? t.d_initial : nullptr;
  p.deterministic = c.deterministic;
  return p;
}

template <typename T>
std::vector<T> cast(const std::vector<float>& values) {
  std::vector<T> cast_values;
  for (float value : values) cast_values.push_back(static_cast<T>(value));
  return cast_values;
}

template <typename T>
std::vector<double> wide(const std::vector<T>& values) {
  std::vector<double> wide_values;
  for (const T& value : values) wide_values.push_back(widen(value));
  return wide_values;
}

template <typename T>
bool check_case(DType dtype, const Case& c, std::mt19937& rng) {
  const Sizes s(c);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const auto values = [&](int64_t count, float scale = 1.0f, float shift = 0.0f) {
    std::vector<float> v(count);
    for (float& x : v) x = shift + scale * normal(rng);
    return v;
  };
  std::vector<float> A(c.d * c.n);
  for (float& x : A) x = -(0.5f + uniform(rng));  // decaying states
  // Per-step values in T, as the device holds them; the rest in float.
  const std::vector<T> u = cast<T>(values(s.steps)), delta = cast<T>(values(s.steps, 0.5f, -1.0f)),
                       z = cast<T>(values(s.steps)), d_out = cast<T>(values(s.steps));
  const std::vector<float> D = values(c.d), delta_bias = values(c.d, 0.3f), initial = values(s.states),
                           d_last_state = values(s.states);
  const std::vector<float> B_float = values(s.projection_B), C_float = values(s.projection_C);
  const std::vector<T> B_T = cast<T>(B_float), C_T = cast<T>(C_float);
  // A varying B or C in T, a fixed one in float.
  const std::vector<double> B_wide = fixed(c.B) ? wide(B_float) : wide(B_T);
  const std::vector<double> C_wide = fixed(c.C) ? wide(C_float) : wide(C_T);

  // The reference, on the host in double.
  std::vector<double> u_w = wide(u), delta_w = wide(delta), z_w = wide(z), d_out_w = wide(d_out), A_w = wide(A),
                      B_w = B_wide, C_w = C_wide, D_w = wide(D), bias_w = wide(delta_bias), initial_w = wide(initial),
                      d_last_w = wide(d_last_state);
  std::vector<double> out_r(s.steps), checkpoints_r(c.batch * c.d * s.chunks * c.n), last_r(s.states),
      d_u_r(s.steps), d_delta_r(s.steps), d_z_r(s.steps), d_A_r(c.batch * c.d * c.n), d_B_r(s.d_projection_B, 0.0),
      d_C_r(s.d_projection_C, 0.0), d_D_r(c.batch * c.d), d_bias_r(c.batch * c.d), d_initial_r(s.states);
  const Tensors<double> host{u_w.data(), delta_w.data(), z_w.data(), A_w.data(), B_w.data(), C_w.data(), D_w.data(),
                             bias_w.data(), initial_w.data(), d_out_w.data(), d_last_w.data(), out_r.data(),
                             checkpoints_r.data(), last_r.data(), d_u_r.data(), d_delta_r.data(), d_z_r.data(),
                             d_A_r.data(), d_B_r.data(), d_C_r.data(), d_D_r.data(), d_bias_r.data(),
                             d_initial_r.data(), c.offsets.data()};
  const ssm::BackwardParams reference = params_of(c, host, DType::Float64, sizeof(double));
  linrec::standalone::reference_forward(reference);
  linrec::standalone::reference_backward(reference);

  // The kernels, on NaN-poisoned outputs (allocate fills every buffer with NaN; varying B's and C's
  // gradients are sums, zeroed as the op layer zeroes them).
  auto u_d = upload(u), delta_d = upload(delta), z_d = upload(z), d_out_d = upload(d_out);
  auto A_d = upload(A), D_d = upload(D), bias_d = upload(delta_bias), initial_d = upload(initial),
       d_last_d = upload(d_last_state);
  auto B_fixed = upload(B_float), C_fixed = upload(C_float);
  auto B_varying = upload(B_T), C_varying = upload(C_T);
  auto offsets_d = upload(c.offsets);
  auto out_d = allocate<T>(s.steps), d_u_d = allocate<T>(s.steps), d_delta_d = allocate<T>(s.steps),
       d_z_d = allocate<T>(s.steps);
  auto checkpoints_d = allocate<float>(c.batch * c.d * s.chunks * c.n), last_d = allocate<float>(s.states),
       d_A_d = allocate<float>(c.batch * c.d * c.n), d_B_d = allocate<float>(s.d_projection_B),
       d_C_d = allocate<float>(s.d_projection_C), d_D_d = allocate<float>(c.batch * c.d),
       d_bias_d = allocate<float>(c.batch * c.d), d_initial_d = allocate<float>(s.states);
  if (!fixed(c.B)) LINREC_CUDA_CHECK(cudaMemset(d_B_d.get(), 0, s.d_projection_B * sizeof(float)));
  if (!fixed(c.C)) LINREC_CUDA_CHECK(cudaMemset(d_C_d.get(), 0, s.d_projection_C * sizeof(float)));
  const auto data = [](auto& buffer) { return static_cast<void*>(buffer.get()); };
  const Tensors<void> device{data(u_d), data(delta_d), data(z_d), data(A_d),
                             fixed(c.B) ? data(B_fixed) : data(B_varying), fixed(c.C) ? data(C_fixed) : data(C_varying),
                             data(D_d), data(bias_d), data(initial_d), data(d_out_d), data(d_last_d), data(out_d),
                             data(checkpoints_d), data(last_d), data(d_u_d), data(d_delta_d), data(d_z_d),
                             data(d_A_d), data(d_B_d), data(d_C_d), data(d_D_d), data(d_bias_d), data(d_initial_d),
                             c.offsets.empty() ? nullptr : offsets_d.get()};
  const ssm::BackwardParams params = params_of(c, device, dtype, sizeof(T));
  ssm::ForwardParams forward = params;
  launch_with_workspace(forward);
  ssm::BackwardParams backward = params;
  launch_with_workspace(backward);

  // Gradients summed over up to 1100 steps: a looser bound than check_kernels' for float32.
  const double bound = dtype == DType::BFloat16 ? 2e-2 : 1e-4;
  const auto compare = [&](const char* what, const std::vector<double>& actual, const std::vector<double>& expected) {
    return matches(what, actual, expected, dtype, bound);
  };
  bool ok = compare("out", download(out_d), out_r) & compare("last_state", download(last_d), last_r) &
            compare("d_u", download(d_u_d), d_u_r) & compare("d_delta", download(d_delta_d), d_delta_r) &
            compare("d_z", download(d_z_d), d_z_r) & compare("d_A", download(d_A_d), d_A_r) &
            compare("d_B", download(d_B_d), d_B_r) & compare("d_C", download(d_C_d), d_C_r) &
            compare("d_D", download(d_D_d), d_D_r) & compare("d_delta_bias", download(d_bias_d), d_bias_r);
  if (c.initial) ok &= compare("d_initial", download(d_initial_d), d_initial_r);
  std::printf("%s %-9s %-52s %s\n", ok ? "ok  " : "FAIL", dtype == DType::BFloat16 ? "bfloat16" : "float32", c.name,
              (std::to_string(c.batch) + " x " + std::to_string(c.d) + " x " + std::to_string(c.n) + " x " +
               std::to_string(c.length)).c_str());
  return ok;
}

const std::vector<Case> kCases = {
    {"lanes, one state dim a lane", 2, 2048, 3, 600, "1", "1", true},
    {"lanes, four state dims a lane, 2 groups", 2, 512, 16, 600, "2", "2"},
    {"lanes, sixteen lanes a channel", 4, 2048, 40, 40, "1", "1"},
    {"lanes, few channels (one dim a lane, sixteen lanes)", 1, 6, 16, 1100, "1", "1", true},
    {"lanes, a row split along time", 1, 512, 40, 1100, "1", "1", true},
    {"lanes, fixed B and C", 2, 1024, 16, 600, "fixed", "fixed"},
    {"lanes, fixed B and C, a row split along time", 1, 512, 40, 1100, "fixed", "fixed", true},
    {"lanes, packed sequences, an empty one", 1, 1024, 4, 600, "1", "1", true, {0, 0, 17, 17, 40, 600}},
    {"lanes, deterministic backward", 2, 70, 16, 1100, "2", "2", false, {}, true},
    {"blocks, B fixed and C varying", 2, 64, 16, 600, "fixed", "1", true},
    {"blocks, n = 65", 2, 16, 65, 600, "1", "1"},
};

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  std::mt19937 rng(20261129);
  bool ok = true;
  for (const Case& c : kCases) {
    if (only.empty() || only == "float32") ok &= check_case<float>(DType::Float32, c, rng);
    if (only.empty() || only == "bfloat16") ok &= check_case<__nv_bfloat16>(DType::BFloat16, c, rng);
  }
  std::printf("%s\n", ok ? "all cases match the reference" : "MISMATCH");
  return ok ? 0 : 1;
}
