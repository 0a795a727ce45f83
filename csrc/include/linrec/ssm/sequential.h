// The selective scan on the CPU: the recurrence one (batch row, channel) at a time, chunk by chunk
// (kChunk steps, ssm/params.h), real or complex (S; the per-step values are real, R). Within a chunk
// the state dims are independent recurrences: each runs over the chunk's steps on its own, its
// decays exp(dt A) first formed for all of them at once (in SIMD vectors for a real state), and the
// per-step values (dt, dt u, the gate, the output and their gradients) are formed once per step, not
// per state dim. Complex gradients follow PyTorch's convention (d Re + i d Im of a real loss): where a
// value multiplies a complex one, its gradient takes the other's conjugate. The backward recomputes
// each chunk's states from the checkpoint before it, keeping the chunk's states and decays, and walks
// each state dim's adjoint backwards. A task's buffers hold one chunk (kChunk steps, or the whole
// length where shorter) and serve all its rows, so that a short call costs its steps: buffers of
// kChunk steps allocated and zeroed for each row made a call of 512 channels at n = 16 cost about as
// much at 1 step as at 256 (docs/design.md, Fused selective scan). Host-only; the op layer
// (cpu/selective_scan.cpp) spreads the tasks over the intra-op pool.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "linrec/cpu/vector.h"
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
  // Element (s, k, j) of a (sequences, d, n) tensor.
  int64_t state_index(int64_t s, int64_t j) const { return (s * p.d + k) * p.n + j; }
  // Of sequence s, none (-1: a padded batch row) reading zeros.
  S initial(int64_t s, int64_t j) const {
    return p.initial && s >= 0 ? static_cast<const S*>(p.initial)[state_index(s, j)] : S(0);
  }
};

// The steps a chunk holds at most in a call of `length` steps.
inline int64_t chunk_capacity(int64_t length) { return std::min(kChunk, length); }

// Each step's sequence in steps [begin, begin + count) of batch row b, and whether the step starts or
// ends it: the same for every channel of the row.
inline void sequences_of_steps(const ForwardParams& p, int64_t b, int64_t begin, int64_t count, int64_t* sequence,
                               uint8_t* starts, uint8_t* ends) {
  const Sequences& q = p.sequences;
  int64_t s = q.packed() ? q.sequence_at(begin) : q.state_row(b);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = begin + i;
    if (q.packed()) {
      s = q.forward_to(s, t);
      starts[i] = q.boundary(s) == t;
      ends[i] = q.boundary(s + 1) - 1 == t;
    } else {
      starts[i] = t == 0;
      ends[i] = t == p.length - 1;
    }
    sequence[i] = s;
  }
}

// The per-step values of one row's chunk [begin, end), formed once for all its state dims: the step
// size, its product with u, and each step's sequence, with whether the step starts or ends it.
// `capacity` steps at most; also the stride of the per-step buffers kept for each state dim.
template <typename T, typename S>
struct ChunkSteps {
  using R = real_t<S>;
  int64_t capacity, begin = 0, count = 0;
  std::vector<R> u, dt, dtu;
  std::vector<int64_t> sequence;
  std::vector<uint8_t> starts, ends;

  explicit ChunkSteps(int64_t capacity_)
      : capacity(capacity_), u(capacity_), dt(capacity_), dtu(capacity_), sequence(capacity_), starts(capacity_),
        ends(capacity_) {}

  void load(const Row<T, S>& r, int64_t begin_, int64_t end) {
    const ForwardParams& p = r.p;
    begin = begin_, count = end - begin_;
    const R bias = r.per_channel(p.delta_bias);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = begin + i;
      u[i] = r.at(p.u, t);
      dt[i] = step_size(r.at(p.delta, t), bias, p.delta_softplus);
      dtu[i] = dt[i] * u[i];
    }
    sequences_of_steps(p, r.b, begin, count, sequence.data(), starts.data(), ends.data());
  }
};

// decays[i] = exp(dt[i] * A) for the count steps: for a real state, in vectors of the baseline target
// (cpu::exp, which takes std::exp lane by lane where a lane leaves its range); for a complex one,
// step.h's decay.
template <typename S>
void decays_of(const real_t<S>* dt, S A, int64_t count, S* decays) {
  if constexpr (is_complex<S>::value) {
    for (int64_t i = 0; i < count; ++i) decays[i] = decay(dt[i], A);
  } else {
    using V = typename cpu::Vector<S, 16>::Values;
    constexpr int kLanes = cpu::Vector<S, 16>::kLanes;
    int64_t i = 0;
    for (; i + kLanes <= count; i += kLanes) {
      V x;
      std::memcpy(&x, dt + i, sizeof(V));
      x = cpu::exp(x * A);
      std::memcpy(decays + i, &x, sizeof(V));
    }
    // The last steps too in a vector (padded), so that a step's decay does not depend on its place in the
    // chunk: a scan of T steps and T scans of one step (selective_state_update) take the same bits.
    if (i < count) {
      V x{};
      std::memcpy(&x, dt + i, (count - i) * sizeof(S));
      x = cpu::exp(x * A);
      std::memcpy(decays + i, &x, (count - i) * sizeof(S));
    }
  }
}

// Runs state dims [j, j + G) over the chunk, each from its `state` (the state before the chunk, then
// after it), with the decays of its steps (decays + g * capacity, capacity = steps.capacity):
// states[g * capacity + i] is dim j + g's state after step i; a step that starts a sequence starts
// from its initial state. The G dims' chains of dependent multiply-adds interleave, so that one's
// latency hides behind the others'.
template <int G, typename T, typename S>
void scan_state_dims(const Row<T, S>& r, const ChunkSteps<T, S>& steps, int64_t j, const S* decays, S* state,
                     S* states) {
  const int64_t capacity = steps.capacity;
  S x[G];
  for (int g = 0; g < G; ++g) x[g] = state[g];
  for (int64_t i = 0; i < steps.count; ++i) {
    const int64_t t = steps.begin + i;
    for (int g = 0; g < G; ++g) {
      const S before = steps.starts[i] ? r.initial(steps.sequence[i], j + g) : x[g];
      x[g] = decays[g * capacity + i] * before + steps.dtu[i] * r.B(j + g, t);
      states[g * capacity + i] = x[g];
    }
  }
  for (int g = 0; g < G; ++g) state[g] = x[g];
}

// Runs every state dim over the chunk (scan_state_dims), in groups of kInterleaved dims and the rest
// one by one: states and decays are [state dim][step] (steps.capacity steps per dim), `carried` holds
// each dim's state before the chunk and after it.
constexpr int kInterleaved = 4;
template <typename T, typename S>
void scan_chunk(const Row<T, S>& r, const ChunkSteps<T, S>& steps, S* carried, S* decays, S* states) {
  const int64_t n = r.p.n, capacity = steps.capacity;
  for (int64_t j = 0; j < n; ++j) decays_of(steps.dt.data(), r.A(j), steps.count, decays + j * capacity);
  int64_t j = 0;
  for (; j + kInterleaved <= n; j += kInterleaved)
    scan_state_dims<kInterleaved>(r, steps, j, decays + j * capacity, carried + j, states + j * capacity);
  for (; j < n; ++j) scan_state_dims<1>(r, steps, j, decays + j * capacity, carried + j, states + j * capacity);
}

// The buffers of one forward task, for each of its rows in turn: each chunk's steps, each dim's state
// before and after the chunk, the chunk's states after each step and decays of each step ([state
// dim][step]), and each step's sum over the state dims.
template <typename T, typename S>
struct ForwardBuffers {
  ChunkSteps<T, S> steps;
  std::vector<S> carried, decays, states, sums;

  explicit ForwardBuffers(const ForwardParams& p)
      : steps(chunk_capacity(p.length)), carried(p.n), decays(steps.capacity * p.n), states(steps.capacity * p.n),
        sums(steps.capacity) {}
};

template <typename T, typename S>
void forward_row(const ForwardParams& p, int64_t b, int64_t k, ForwardBuffers<T, S>& buffers) {
  using R = real_t<S>;
  const Row<T, S> r(p, b, k);
  const int64_t n = p.n, capacity = buffers.steps.capacity;
  auto& [steps, carried, decays, states, sums] = buffers;
  std::fill(carried.begin(), carried.end(), S(0));
  S* checkpoints = p.checkpoints ? static_cast<S*>(p.checkpoints) + r.row * chunks_of(p.length) * n : nullptr;
  S* last_state = static_cast<S*>(p.last_state);
  const R D = r.per_channel(p.D);
  for (int64_t begin = 0; begin < p.length; begin += kChunk) {
    if (checkpoints) std::copy(carried.begin(), carried.end(), checkpoints + begin / kChunk * n);
    steps.load(r, begin, std::min(begin + kChunk, p.length));
    scan_chunk(r, steps, carried.data(), decays.data(), states.data());
    std::fill(sums.begin(), sums.begin() + steps.count, S(0));
    for (int64_t j = 0; j < n; ++j) {
      const S* x = states.data() + j * capacity;
      for (int64_t i = 0; i < steps.count; ++i) {
        sums[i] += r.C(j, begin + i) * x[i];
        if (steps.ends[i] && steps.sequence[i] >= 0) last_state[r.state_index(steps.sequence[i], j)] = x[i];
      }
    }
    for (int64_t i = 0; i < steps.count; ++i) {
      const int64_t t = begin + i;
      R y = readout(sums[i]) + D * steps.u[i];
      if (p.z) y *= silu(r.at(p.z, t));
      static_cast<T*>(p.out)[r.row * p.length + t] = static_cast<T>(y);
    }
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    for (int64_t j = 0; j < n; ++j) last_state[r.state_index(s, j)] = r.initial(s, j);
  });
}

// The buffers of one backward task, for each of its rows in turn: each chunk's steps, its recomputed
// states and decays ([state dim][step]) and their sums over the state dims, the states it is
// recomputed from, what each dim's adjoint passes back from its first step (conj(decay) * adjoint), a
// row's gradients of A and of fixed B and C per dim, and the per-step gradients of the output sum, u
// and the step size.
template <typename T, typename S>
struct BackwardBuffers {
  using R = real_t<S>;
  ChunkSteps<T, S> steps;
  std::vector<S> states, decays, sums, recomputed, carried, d_A, d_B_fixed, d_C_fixed;
  std::vector<R> d_sum, d_u, d_dt;

  explicit BackwardBuffers(const BackwardParams& p)
      : steps(chunk_capacity(p.length)), states(steps.capacity * p.n), decays(steps.capacity * p.n),
        sums(steps.capacity), recomputed(p.n), carried(p.n), d_A(p.n), d_B_fixed(p.n), d_C_fixed(p.n),
        d_sum(steps.capacity), d_u(steps.capacity), d_dt(steps.capacity) {}
};

// Adds the contributions of one row to every gradient. Varying d_B and d_C are shared by the
// channels of a group: the caller runs the rows of a group one after another.
template <typename T, typename S>
void backward_row(const BackwardParams& p, int64_t b, int64_t k, BackwardBuffers<T, S>& buffers) {
  using R = real_t<S>;
  const Row<T, S> r(p, b, k);
  const int64_t n = p.n, chunks = chunks_of(p.length), capacity = buffers.steps.capacity;
  auto& [steps, states, decays, sums, recomputed, carried, d_A, d_B_fixed, d_C_fixed, d_sum, d_u, d_dt] = buffers;
  for (std::vector<S>* zeroed : {&carried, &d_A, &d_B_fixed, &d_C_fixed})
    std::fill(zeroed->begin(), zeroed->end(), S(0));
  S* d_B = static_cast<S*>(p.d_B);
  S* d_C = static_cast<S*>(p.d_C);
  R d_D = 0, d_delta_bias = 0;
  const R D = r.per_channel(p.D), bias = r.per_channel(p.delta_bias);
  const S* checkpoints = static_cast<const S*>(p.saved_checkpoints) + r.row * chunks * n;
  const auto d_last = [&](int64_t s, int64_t j) {
    return p.d_last_state ? static_cast<const S*>(p.d_last_state)[r.state_index(s, j)] : S(0);
  };

  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t begin = c * kChunk;
    steps.load(r, begin, std::min(begin + kChunk, p.length));
    const int64_t count = steps.count;
    std::copy(checkpoints + c * n, checkpoints + (c + 1) * n, recomputed.begin());
    scan_chunk(r, steps, recomputed.data(), decays.data(), states.data());
    std::fill(sums.begin(), sums.begin() + count, S(0));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < count; ++i) sums[i] += r.C(j, begin + i) * states[j * capacity + i];
    // The per-step gradients that come before the state dims': the gate's, D's and the output sum's.
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = begin + i;
      const R u = steps.u[i], d_out = r.at(p.d_out, t);
      R d_y = d_out;
      if (p.z) {
        const R z = r.at(p.z, t), y = readout(sums[i]) + D * u;
        d_y = d_out * silu(z);
        static_cast<T*>(p.d_z)[r.row * p.length + t] = static_cast<T>(d_out * y * silu_slope(z));
      }
      d_u[i] = d_y * D;
      d_dt[i] = 0;
      d_D += d_y * u;
      d_sum[i] = kReadoutScale<S> * d_y;  // d out / d (sum over n of C x)
    }
    for (int64_t j = 0; j < n; ++j) {
      const S A = r.A(j);
      const S* x = states.data() + j * capacity;
      const S* a_of = decays.data() + j * capacity;
      S passed = carried[j];
      for (int64_t i = count - 1; i >= 0; --i) {
        const int64_t t = begin + i, s = steps.sequence[i];
        const S C = r.C(j, t), a = a_of[i];
        const S adjoint = d_sum[i] * conj(C) + (steps.ends[i] ? d_last(s, j) : passed);
        const S before = steps.starts[i] ? r.initial(s, j) : (i > 0 ? x[i - 1] : checkpoints[c * n + j]);
        const S d_decay = adjoint * conj(before);  // d out / d exp(dt * A)
        const R d_input = real_dot(adjoint, r.B(j, t));  // d out / d (dt * u)
        d_u[i] += d_input * steps.dt[i];
        d_dt[i] += d_input * steps.u[i] + real_dot(d_decay, a * A);
        d_A[j] += d_decay * conj(a) * steps.dt[i];
        if (p.B.varying) d_B[r.B_index(j, t)] += adjoint * steps.dtu[i];
        else d_B_fixed[j] += adjoint * steps.dtu[i];
        if (p.C.varying) d_C[r.C_index(j, t)] += d_sum[i] * conj(x[i]);
        else d_C_fixed[j] += d_sum[i] * conj(x[i]);
        if (steps.starts[i]) {
          if (p.d_initial) static_cast<S*>(p.d_initial)[r.state_index(s, j)] = conj(a) * adjoint;
          passed = S(0);
        } else {
          passed = conj(a) * adjoint;
        }
      }
      carried[j] = passed;
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = begin + i;
      const R shifted = r.at(p.delta, t) + bias;
      const R d_delta = p.delta_softplus ? d_dt[i] * softplus_slope(shifted) : d_dt[i];
      d_delta_bias += d_delta;
      static_cast<T*>(p.d_u)[r.row * p.length + t] = static_cast<T>(d_u[i]);
      static_cast<T*>(p.d_delta)[r.row * p.length + t] = static_cast<T>(d_delta);
    }
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    if (p.d_initial)
      for (int64_t j = 0; j < n; ++j) static_cast<S*>(p.d_initial)[r.state_index(s, j)] = d_last(s, j);
  });
  for (int64_t j = 0; j < n; ++j) {
    static_cast<S*>(p.d_A)[r.row * n + j] = d_A[j];
    if (!p.B.varying) d_B[r.row * n + j] = d_B_fixed[j];
    if (!p.C.varying) d_C[r.row * n + j] = d_C_fixed[j];
  }
  if (p.d_D) static_cast<R*>(p.d_D)[r.row] = d_D;
  if (p.d_delta_bias) static_cast<R*>(p.d_delta_bias)[r.row] = d_delta_bias;
}

}  // namespace linrec::ssm::sequential
