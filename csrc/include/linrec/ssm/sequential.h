// The selective scan on the CPU: the recurrence step by step, one (batch row, channel) at a time,
// with the state's n dims side by side, real or complex (S; the per-step values are real, R).
// Complex gradients follow PyTorch's convention (d Re + i d Im of a real loss): where a value
// multiplies a complex one, its gradient takes the other's conjugate. The backward recomputes each chunk's states from the
// checkpoint before it (ssm/params.h), keeping kChunk x n states in memory per task, and walks the
// chunk backwards. Host-only, torch-free; the op layer (cpu/selective_scan.cpp) spreads the tasks
// over the intra-op pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "linrec/ssm/params.h"
#include "linrec/ssm/step.h"

namespace linrec::ssm::sequential {

// Operands of one (batch row b, channel k): the per-step and per-channel ones read as R, the state's
// (A, B, C, initial) as S.
template <typename T, typename S>
struct Row {
  using R = real_t<S>;
  const ForwardParams& p;
  int64_t b, k, row;  // row = b * d + k, the row of (batch, d, length) tensors
  // Where state dim j's B and C start: first + j * stride (a fixed one's value, or a varying one's time row).
  int64_t B_first, B_stride, C_first, C_stride;

  Row(const ForwardParams& params, int64_t b_, int64_t k_)
      : p(params), b(b_), k(k_), row(b_ * params.d + k_),
        B_first(params.B.offset(b_, k_, 0, params.d, params.n, params.length)),
        B_stride(params.B.varying ? params.length : 1),
        C_first(params.C.offset(b_, k_, 0, params.d, params.n, params.length)),
        C_stride(params.C.varying ? params.length : 1) {}

  R at(const void* data, int64_t t) const { return static_cast<R>(static_cast<const T*>(data)[row * p.length + t]); }
  // A complex state's projections are in S (the op layer checks it).
  static S read(const Projection& M, int64_t index) {
    if constexpr (!is_complex<S>::value)
      if (M.varying && !M.wide) return static_cast<S>(static_cast<const T*>(M.data)[index]);
    return static_cast<const S*>(M.data)[index];
  }
  S B(int64_t j, int64_t t) const { return read(p.B, B_first + j * B_stride + (p.B.varying ? t : 0)); }
  S C(int64_t j, int64_t t) const { return read(p.C, C_first + j * C_stride + (p.C.varying ? t : 0)); }
  // The offset of state dim j's step t in a varying projection's (or its gradient's) memory.
  int64_t B_index(int64_t j, int64_t t) const { return B_first + j * B_stride + t; }
  int64_t C_index(int64_t j, int64_t t) const { return C_first + j * C_stride + t; }
  R per_channel(const void* data) const { return data ? static_cast<const R*>(data)[k] : R(0); }
  S A(int64_t j) const { return static_cast<const S*>(p.A)[k * p.n + j]; }
  R dt(int64_t t) const { return step_size(at(p.delta, t), per_channel(p.delta_bias), p.delta_softplus); }
  // Element (s, k, j) of a (sequences, d, n) tensor.
  int64_t state_index(int64_t s, int64_t j) const { return (s * p.d + k) * p.n + j; }
  S initial(int64_t s, int64_t j) const { return p.initial ? static_cast<const S*>(p.initial)[state_index(s, j)] : S(0); }
  bool start(int64_t s, int64_t t) const { return p.sequences.packed() ? p.sequences.boundary(s) == t : t == 0; }
  bool end(int64_t s, int64_t t) const {
    return p.sequences.packed() ? p.sequences.boundary(s + 1) - 1 == t : t == p.length - 1;
  }
};

// Advances the states of steps [begin, end) of one row: states[j] holds the state before `begin` and
// ends after `end - 1`; visit(t, s, states) sees the states after step t of sequence s.
template <typename T, typename S, typename Visit>
void scan_steps(const Row<T, S>& r, int64_t begin, int64_t end, S* states, Visit&& visit) {
  const ForwardParams& p = r.p;
  int64_t s = p.sequences.packed() ? p.sequences.sequence_at(begin) : r.b;
  for (int64_t t = begin; t < end; ++t) {
    if (p.sequences.packed()) s = p.sequences.forward_to(s, t);
    const real_t<S> dt = r.dt(t);
    const real_t<S> dtu = dt * r.at(p.u, t);
    const bool start = r.start(s, t);
    for (int64_t j = 0; j < p.n; ++j) {
      const S before = start ? r.initial(s, j) : states[j];
      states[j] = decay(dt, r.A(j)) * before + dtu * r.B(j, t);
    }
    visit(t, s, states);
  }
}

template <typename T, typename S>
void forward_row(const ForwardParams& p, int64_t b, int64_t k) {
  const Row<T, S> r(p, b, k);
  std::vector<S> states(p.n, S(0));
  S* checkpoints = static_cast<S*>(p.checkpoints) + r.row * chunks_of(p.length) * p.n;
  S* last_state = static_cast<S*>(p.last_state);
  for (int64_t begin = 0; begin < p.length; begin += kChunk) {
    std::copy(states.begin(), states.end(), checkpoints + begin / kChunk * p.n);
    scan_steps(r, begin, std::min(begin + kChunk, p.length), states.data(), [&](int64_t t, int64_t s, const S* x) {
      S sum = 0;
      for (int64_t j = 0; j < p.n; ++j) sum += r.C(j, t) * x[j];
      const real_t<S> u = r.at(p.u, t);
      real_t<S> y = readout(sum) + r.per_channel(p.D) * u;
      if (p.z) y *= silu(r.at(p.z, t));
      static_cast<T*>(p.out)[r.row * p.length + t] = static_cast<T>(y);
      if (r.end(s, t))
        for (int64_t j = 0; j < p.n; ++j) last_state[r.state_index(s, j)] = x[j];
    });
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    for (int64_t j = 0; j < p.n; ++j) last_state[r.state_index(s, j)] = r.initial(s, j);
  });
}

// Adds the contributions of one row to every gradient. Varying d_B and d_C are shared by the
// channels of a group: the caller runs the rows of a group one after another.
template <typename T, typename S>
void backward_row(const BackwardParams& p, int64_t b, int64_t k) {
  using R = real_t<S>;
  const Row<T, S> r(p, b, k);
  const int64_t n = p.n, chunks = chunks_of(p.length);
  std::vector<S> states((kChunk + 1) * n);  // the states before the chunk, then after each of its steps
  std::vector<S> carried(n, S(0));          // conj(decay(t + 1)) * adjoint(t + 1): what step t + 1 passes back
  std::vector<S> d_A(n, S(0)), d_B_fixed(n, S(0)), d_C_fixed(n, S(0));
  R d_D = 0, d_delta_bias = 0;
  const S* checkpoints = static_cast<const S*>(p.saved_checkpoints) + r.row * chunks * n;
  const auto d_last = [&](int64_t s, int64_t j) {
    return p.d_last_state ? static_cast<const S*>(p.d_last_state)[r.state_index(s, j)] : S(0);
  };

  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t begin = c * kChunk, end = std::min(begin + kChunk, p.length);
    std::copy(checkpoints + c * n, checkpoints + (c + 1) * n, states.begin());
    std::vector<S> running(states.begin(), states.begin() + n);
    scan_steps(r, begin, end, running.data(), [&](int64_t t, int64_t, const S* x) {
      std::copy(x, x + n, states.begin() + (t - begin + 1) * n);
    });
    int64_t s = p.sequences.packed() ? p.sequences.sequence_at(end - 1) : b;
    for (int64_t t = end - 1; t >= begin; --t) {
      if (p.sequences.packed()) s = p.sequences.backward_to(s, t);
      const S* x = states.data() + (t - begin + 1) * n;
      const S* x_before = states.data() + (t - begin) * n;
      const R u = r.at(p.u, t), dt = r.dt(t), dtu = dt * u, d_out = r.at(p.d_out, t);
      const bool start = r.start(s, t), end_of_sequence = r.end(s, t);
      S sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += r.C(j, t) * x[j];
      const R y = readout(sum) + r.per_channel(p.D) * u;
      R d_y = d_out;
      if (p.z) {
        const R z = r.at(p.z, t);
        d_y = d_out * silu(z);
        static_cast<T*>(p.d_z)[r.row * p.length + t] = static_cast<T>(d_out * y * silu_slope(z));
      }
      R d_u = d_y * r.per_channel(p.D), d_dt = 0;
      d_D += d_y * u;
      const R d_sum = kReadoutScale<S> * d_y;  // d out / d (sum over n of C x)
      for (int64_t j = 0; j < n; ++j) {
        const S B = r.B(j, t), C = r.C(j, t), A = r.A(j);
        const S adjoint = d_sum * conj(C) + (end_of_sequence ? d_last(s, j) : carried[j]);
        const S a = decay(dt, A);
        const S before = start ? r.initial(s, j) : x_before[j];
        const S d_decay = adjoint * conj(before);  // d out / d exp(dt * A)
        const R d_input = real_dot(adjoint, B);   // d out / d (dt * u)
        d_u += d_input * dt;
        d_dt += d_input * u + real_dot(d_decay, a * A);
        d_A[j] += d_decay * conj(a) * dt;
        if (p.B.varying) static_cast<S*>(p.d_B)[r.B_index(j, t)] += adjoint * dtu;
        else d_B_fixed[j] += adjoint * dtu;
        if (p.C.varying) static_cast<S*>(p.d_C)[r.C_index(j, t)] += d_sum * conj(x[j]);
        else d_C_fixed[j] += d_sum * conj(x[j]);
        if (start) {
          if (p.d_initial) static_cast<S*>(p.d_initial)[r.state_index(s, j)] = conj(a) * adjoint;
          carried[j] = S(0);
        } else {
          carried[j] = conj(a) * adjoint;
        }
      }
      const R shifted = r.at(p.delta, t) + r.per_channel(p.delta_bias);
      const R d_delta = p.delta_softplus ? d_dt * softplus_slope(shifted) : d_dt;
      d_delta_bias += d_delta;
      static_cast<T*>(p.d_u)[r.row * p.length + t] = static_cast<T>(d_u);
      static_cast<T*>(p.d_delta)[r.row * p.length + t] = static_cast<T>(d_delta);
    }
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    if (p.d_initial)
      for (int64_t j = 0; j < n; ++j) static_cast<S*>(p.d_initial)[r.state_index(s, j)] = d_last(s, j);
  });
  for (int64_t j = 0; j < n; ++j) {
    static_cast<S*>(p.d_A)[r.row * n + j] = d_A[j];
    if (!p.B.varying) static_cast<S*>(p.d_B)[r.row * n + j] = d_B_fixed[j];
    if (!p.C.varying) static_cast<S*>(p.d_C)[r.row * n + j] = d_C_fixed[j];
  }
  if (p.d_D) static_cast<R*>(p.d_D)[r.row] = d_D;
  if (p.d_delta_bias) static_cast<R*>(p.d_delta_bias)[r.row] = d_delta_bias;
}

}  // namespace linrec::ssm::sequential
