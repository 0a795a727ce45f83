// The selective scan on the CPU for a real float32 state, vectorized across channels: the lanes of a
// vector are W neighbouring channels of one batch row (W = 8, or 4 in the baseline's 16-byte vectors),
// which share the time structure and, varying B and C being per group, each step's B and C (one
// broadcast value a state dim). A step costs each state dim one vector exp of dt A, two multiply-adds
// and, in the forward, one more for the output sum, whatever n is; the per-step work (softplus, the
// gate, loads and stores) is shared by W channels, where the per-channel loop (ssm/sequential.h)
// shares it among the n state dims only, which at small n is most of a step. The time rows are moved
// into [step][lane] tiles of kTile steps and back (the tensors are time-last). The backward recomputes
// each chunk's states from its checkpoint, keeping the state before each tile (and at small n every
// state and decay of the chunk), then walks the tiles from last to first, recomputing a tile's states
// and decays where they were not kept and walking the adjoint back over them. A varying B's and C's
// gradient terms are sums over channels: each tile's terms are added across the lanes W steps at a
// time (a transposing reduction) and added to the gradient's row in a fixed order. Host-only;
// cpu/selective_scan.cpp runs the runs of channels on the intra-op pool, each inside
// cpu::with_vector_width.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "linrec/cpu/vector.h"
#include "linrec/ssm/lane_vectors.h"
#include "linrec/ssm/params.h"
#include "linrec/ssm/sequential.h"  // Row::read

namespace linrec::ssm::lanes {

// Steps of the [step][lane] tiles: a multiple of every lane count.
constexpr int kTile = 16;
// The backward keeps a whole chunk's states and decays, rather than recomputing each tile's, where
// they take at most this many (state dim, step) pairs: n <= 8 at chunks of 512 steps.
constexpr int64_t kKeptStateSteps = 4096;
// The widest vectors the lanes take (cpu/selective_scan.cpp), and their float32 lanes: the buffers'
// lane stride for every width.
constexpr int kMaxBytes = 32;
constexpr int kMaxLanes = kMaxBytes / static_cast<int>(sizeof(float));

// Whether the lanes take a call: a real float32 state (float32, bfloat16 or float16 values).
inline bool takes(const ForwardParams& p) { return p.state_dtype == DType::Float32; }

// Channels whose varying B and C share one group: the lanes of a vector never straddle them.
inline int64_t shared_channels(const ForwardParams& p) {
  int64_t unit = p.d;
  for (const Projection* M : {&p.B, &p.C})
    if (M->varying) unit = std::gcd(unit, p.d / M->groups);
  return unit;
}

// The runs of at most `lanes` channels a batch row splits into, none straddling a group of shared
// channels: run r starts at first(r) and holds count(r) channels.
struct Runs {
  int64_t lanes, unit, per_unit, per_row;
  Runs(const ForwardParams& p, int64_t lanes_)
      : lanes(lanes_), unit(shared_channels(p)), per_unit((unit + lanes - 1) / lanes), per_row(p.d / unit * per_unit) {}
  int64_t first(int64_t r) const { return r / per_unit * unit + r % per_unit * lanes; }
  int count(int64_t r) const { return static_cast<int>(std::min(lanes, unit - r % per_unit * lanes)); }
};

// Where the packed sequences start and end along a tile: shared by all lanes.
struct TileSteps {
  uint8_t starts[kTile], ends[kTile];
  int64_t sequence[kTile];
  void load(const ForwardParams& p, int64_t b, int64_t t0, int steps) {
    sequential::sequences_of_steps(p, b, t0, steps, sequence, starts, ends);
  }
};

// One run of channels [first, first + lanes) of batch row b: its operands, per lane.
template <typename T, int Bytes>
struct Channels {
  using V = typename cpu::Vector<float, Bytes>::Values;
  static constexpr int W = cpu::Vector<float, Bytes>::kLanes;
  using Row = sequential::Row<T, float>;
  const ForwardParams& p;
  int64_t b, first, row;  // row: of (batch, d, length) tensors, the first lane's
  int lanes;
  int64_t B_first, C_first;  // a varying projection's time row of state dim 0

  Channels(const ForwardParams& params, int64_t b_, int64_t first_, int lanes_)
      : p(params), b(b_), first(first_), row(b_ * params.d + first_), lanes(lanes_),
        B_first(params.B.offset(b_, first_, 0, params.d, params.n, params.length)),
        C_first(params.C.offset(b_, first_, 0, params.d, params.n, params.length)) {}

  // Each lane's value of a per-channel (d,) operand, 0 without one.
  V per_channel(const void* data) const {
    V v{};
    if (data)
      for (int l = 0; l < lanes; ++l) v[l] = static_cast<const float*>(data)[first + l];
    return v;
  }
  // [j][lane] <- A's, and fixed B's and C's, elements (channel, j).
  void per_state_dim(float* A, float* B, float* C) const {
    per_state_dim(nullptr, p.A, A);
    if (!p.B.varying) per_state_dim(&p.B, nullptr, B);
    if (!p.C.varying) per_state_dim(&p.C, nullptr, C);
  }
  // [j][lane] <- element (channel, j) of a (d, n) operand, for every state dim.
  void per_state_dim(const Projection* M, const void* A, float* target) const {
    for (int64_t j = 0; j < p.n; ++j)
      for (int l = 0; l < W; ++l) {
        const int64_t index = (first + l) * p.n + j;
        target[j * W + l] = l >= lanes ? 0.0f : M ? Row::read(*M, index) : static_cast<const float*>(A)[index];
      }
  }
  // Lane l's element (s, first + l, j) of a (sequences, d, n) operand, 0 without one or without a
  // sequence (s = -1: a padded batch row).
  V state_of(const void* data, int64_t s, int64_t j) const {
    V v{};
    if (data && s >= 0)
      for (int l = 0; l < lanes; ++l) v[l] = static_cast<const float*>(data)[(s * p.d + first + l) * p.n + j];
    return v;
  }
  void set_state(void* data, int64_t s, int64_t j, V v) const {
    if (s < 0) return;
    for (int l = 0; l < lanes; ++l) static_cast<float*>(data)[(s * p.d + first + l) * p.n + j] = v[l];
  }
  // State dim j's B (C) at step t: a varying one's broadcast, a fixed one's per lane.
  V B(int64_t j, int64_t t, const float* fixed) const {
    if (p.B.varying) return cpu::splat<V>(Row::read(p.B, B_first + j * p.length + t));
    return load<V>(fixed + j * W);
  }
  V C(int64_t j, int64_t t, const float* fixed) const {
    if (p.C.varying) return cpu::splat<V>(Row::read(p.C, C_first + j * p.length + t));
    return load<V>(fixed + j * W);
  }
  // The (batch, d, length) row of lane 0 in an operand of T.
  const T* time_rows(const void* data) const { return static_cast<const T*>(data) + row * p.length; }
  T* time_rows(void* data) const { return static_cast<T*>(data) + row * p.length; }
};

// The buffers of one thread's forward runs: per state dim and lane, A, fixed B and C and the state;
// per step and lane of a tile, u, delta, z and the output.
struct ForwardBuffers {
  std::vector<float> A, B, C, state, u, delta, z, out;
  explicit ForwardBuffers(const ForwardParams& p)
      : A(p.n * kMaxLanes), B(p.n * kMaxLanes), C(p.n * kMaxLanes), state(p.n * kMaxLanes), u(kTile * kMaxLanes),
        delta(kTile * kMaxLanes), z(kTile * kMaxLanes), out(kTile * kMaxLanes) {}
};

template <typename T, int Bytes>
void forward(const ForwardParams& p, int64_t b, int64_t first, int lanes, ForwardBuffers& buffers) {
  using Ch = Channels<T, Bytes>;
  using V = typename Ch::V;
  constexpr int W = Ch::W;
  const Ch ch(p, b, first, lanes);
  const int64_t n = p.n, chunks = chunks_of(p.length);
  float *A = buffers.A.data(), *B = buffers.B.data(), *C = buffers.C.data(), *x = buffers.state.data();
  ch.per_state_dim(A, B, C);
  std::fill(x, x + n * W, 0.0f);
  const V D = ch.per_channel(p.D), bias = ch.per_channel(p.delta_bias);
  const T *u = ch.time_rows(p.u), *delta = ch.time_rows(p.delta), *z = p.z ? ch.time_rows(p.z) : nullptr;
  T* out = ch.time_rows(p.out);
  float* checkpoints = static_cast<float*>(p.checkpoints);
  TileSteps flags;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(begin + kChunk, p.length);
    if (checkpoints)
      for (int l = 0; l < lanes; ++l)
        for (int64_t j = 0; j < n; ++j) checkpoints[((ch.row + l) * chunks + c) * n + j] = x[j * W + l];
    for (int64_t t0 = begin; t0 < end; t0 += kTile) {
      const int steps = static_cast<int>(std::min<int64_t>(kTile, end - t0));
      gather<V, W>(u + t0, p.length, lanes, steps, buffers.u.data());
      gather<V, W>(delta + t0, p.length, lanes, steps, buffers.delta.data());
      if (z) gather<V, W>(z + t0, p.length, lanes, steps, buffers.z.data());
      flags.load(p, b, t0, steps);
      for (int i = 0; i < steps; ++i) {
        const int64_t t = t0 + i, s = flags.sequence[i];
        const V u_i = load<V>(buffers.u.data() + i * W), shifted = load<V>(buffers.delta.data() + i * W) + bias;
        const V dt = p.delta_softplus ? softplus(shifted) : shifted, dtu = dt * u_i;
        V sum{};
        for (int64_t j = 0; j < n; ++j) {
          const V a = cpu::exp(dt * load<V>(A + j * W));
          const V before = flags.starts[i] ? ch.state_of(p.initial, s, j) : load<V>(x + j * W);
          const V x_j = cpu::multiply_add(a, before, dtu * ch.B(j, t, B));
          store(x + j * W, x_j);
          sum = cpu::multiply_add(ch.C(j, t, C), x_j, sum);
          if (flags.ends[i]) ch.set_state(p.last_state, s, j, x_j);
        }
        V y = cpu::multiply_add(D, u_i, sum);
        if (z) {
          const V z_i = load<V>(buffers.z.data() + i * W);
          y = y * (z_i * sigmoid(z_i));
        }
        store(buffers.out.data() + i * W, y);
      }
      scatter<V, W>(buffers.out.data(), p.length, lanes, steps, out + t0);
    }
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    for (int64_t j = 0; j < n; ++j) ch.set_state(p.last_state, s, j, ch.state_of(p.initial, s, j));
  });
}

// The buffers of one thread's backward runs. Per state dim and lane: A, fixed B and C, the state, the
// adjoint passed back, and the sums of A's and fixed B's and C's gradient terms; the state before each
// tile of a chunk; a tile's states and decays ([step][state dim][lane]) and its varying B's and C's
// gradient terms ([state dim][step][lane]); per step and lane, u, dt's slope in delta, dt and dt u of a
// chunk and the other per-step values of a tile.
struct BackwardBuffers {
  // The steps of a chunk, in whole tiles.
  static int64_t chunk_steps(const ForwardParams& p) { return (std::min(kChunk, p.length) + kTile - 1) / kTile * kTile; }
  static bool keeps_chunk(const ForwardParams& p) { return p.n * chunk_steps(p) <= kKeptStateSteps; }
  static int64_t kept_steps(const ForwardParams& p) { return keeps_chunk(p) ? chunk_steps(p) : kTile; }
  std::vector<float> A, B, C, state, adjoint, d_A, d_B, d_C, before_tile, states, decays, d_B_terms, d_C_terms;
  std::vector<float> u, delta, dt, dtu, z, d_out, d_sum, d_u, d_delta, d_z;
  explicit BackwardBuffers(const BackwardParams& p)
      : A(p.n * kMaxLanes), B(p.n * kMaxLanes), C(p.n * kMaxLanes), state(p.n * kMaxLanes),
        adjoint(p.n * kMaxLanes), d_A(p.n * kMaxLanes), d_B(p.n * kMaxLanes), d_C(p.n * kMaxLanes),
        before_tile((std::min(kChunk, p.length) + kTile - 1) / kTile * p.n * kMaxLanes),
        states(kept_steps(p) * p.n * kMaxLanes), decays(kept_steps(p) * p.n * kMaxLanes), d_B_terms(kTile * p.n * kMaxLanes),
        d_C_terms(kTile * p.n * kMaxLanes), u(chunk_steps(p) * kMaxLanes), delta(chunk_steps(p) * kMaxLanes),
        dt(chunk_steps(p) * kMaxLanes), dtu(chunk_steps(p) * kMaxLanes), z(kTile * kMaxLanes), d_out(kTile * kMaxLanes), d_sum(kTile * kMaxLanes),
        d_u(kTile * kMaxLanes), d_delta(kTile * kMaxLanes), d_z(kTile * kMaxLanes) {}
};

// Adds a tile's terms ([state dim][step][lane]) of a varying projection's gradient, summed over the
// lanes, to its rows (state dim j's at row + j * length, from step t0).
template <typename V, int W>
inline void add_lane_sums(const float* terms, int64_t n, int steps, int64_t length, float* row) {
  for (int64_t j = 0; j < n; ++j)
    for (int i0 = 0; i0 < steps; i0 += W) {
      V v[W];
      for (int i = 0; i < W; ++i) v[bit_reversed(i, log2_of(W))] = load<V>(terms + (j * kTile + i0 + i) * W);
      const int count = std::min(W, steps - i0);
      float* target = row + j * length + i0;
      cpu::store(target, cpu::load<V>(target, 0, count, 0.0f) + lane_sums<V, W>(v), 0, count);
    }
}

// Adds the contributions of one run of channels to every gradient. Varying d_B and d_C are shared by
// the channels of a group: the caller runs the runs of a group one after another.
template <typename T, int Bytes>
void backward(const BackwardParams& p, int64_t b, int64_t first, int lanes, BackwardBuffers& buffers) {
  using Ch = Channels<T, Bytes>;
  using V = typename Ch::V;
  constexpr int W = Ch::W;
  const Ch ch(p, b, first, lanes);
  const int64_t n = p.n, chunks = chunks_of(p.length);
  auto& bf = buffers;
  const bool keeps_chunk = BackwardBuffers::keeps_chunk(p);
  float *A = bf.A.data(), *B = bf.B.data(), *C = bf.C.data(), *x = bf.state.data(), *g = bf.adjoint.data();
  ch.per_state_dim(A, B, C);
  for (std::vector<float>* zeroed : {&bf.adjoint, &bf.d_A, &bf.d_B, &bf.d_C})
    std::fill(zeroed->begin(), zeroed->begin() + n * W, 0.0f);
  const V D = ch.per_channel(p.D), bias = ch.per_channel(p.delta_bias);
  const auto valid = cpu::lane_range<float, W>(0, lanes);
  V d_D{}, d_bias{};
  const T *u = ch.time_rows(p.u), *delta = ch.time_rows(p.delta), *z = p.z ? ch.time_rows(p.z) : nullptr;
  const T* d_out = ch.time_rows(p.d_out);
  T *d_u = ch.time_rows(p.d_u), *d_delta = ch.time_rows(p.d_delta), *d_z = p.z ? ch.time_rows(p.d_z) : nullptr;
  const float* checkpoints = static_cast<const float*>(p.saved_checkpoints);
  float* d_B_rows = p.B.varying ? static_cast<float*>(p.d_B) + ch.B_first : nullptr;
  float* d_C_rows = p.C.varying ? static_cast<float*>(p.d_C) + ch.C_first : nullptr;
  TileSteps flags;

  // The per-step values of steps [t0, t0 + steps) of the chunk from `begin`: u, the slope of dt in
  // delta, dt and dt u, kept for the whole chunk at [t0 - begin].
  const auto load_steps = [&](int64_t begin, int64_t t0, int steps) {
    const int64_t at = (t0 - begin) * W;
    gather<V, W>(u + t0, p.length, lanes, steps, bf.u.data() + at);
    gather<V, W>(delta + t0, p.length, lanes, steps, bf.delta.data() + at);
    for (int64_t i = at; i < at + steps * W; i += W) {
      const V shifted = load<V>(bf.delta.data() + i) + bias;
      V slope = cpu::splat<V>(1.0f);
      const V dt = p.delta_softplus ? softplus(shifted, &slope) : shifted;
      store(bf.delta.data() + i, slope);
      store(bf.dt.data() + i, dt);
      store(bf.dtu.data() + i, dt * load<V>(bf.u.data() + i));
    }
  };
  // Runs the states (x) over steps [t0, t0 + steps) of the chunk from `begin`; where `states` is given,
  // keeps each step's states and decays there ([step][state dim][lane] from t0). `flags` hold the steps'.
  const auto run_steps = [&](int64_t begin, int64_t t0, int steps, float* states, float* decays) {
    for (int i = 0; i < steps; ++i) {
      const int64_t at = (t0 - begin + i) * W;
      const V dt = load<V>(bf.dt.data() + at), dtu = load<V>(bf.dtu.data() + at);
      for (int64_t j = 0; j < n; ++j) {
        const V a = cpu::exp(dt * load<V>(A + j * W));
        const V before = flags.starts[i] ? ch.state_of(p.initial, flags.sequence[i], j) : load<V>(x + j * W);
        const V x_j = cpu::multiply_add(a, before, dtu * ch.B(j, t0 + i, B));
        store(x + j * W, x_j);
        if (states) {
          store(states + (i * n + j) * W, x_j);
          store(decays + (i * n + j) * W, a);
        }
      }
    }
  };

  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t begin = c * kChunk, end = std::min(begin + kChunk, p.length);
    const int tiles = static_cast<int>((end - begin + kTile - 1) / kTile);
    for (int l = 0; l < lanes; ++l)
      for (int64_t j = 0; j < n; ++j) x[j * W + l] = checkpoints[((ch.row + l) * chunks + c) * n + j];
    for (int tile = 0; tile < tiles; ++tile) {  // the state before each tile
      const int64_t t0 = begin + tile * kTile;
      std::copy(x, x + n * W, bf.before_tile.data() + tile * n * W);
      const int steps = static_cast<int>(std::min<int64_t>(kTile, end - t0));
      load_steps(begin, t0, steps);
      flags.load(p, b, t0, steps);
      const int64_t kept = keeps_chunk ? (t0 - begin) * n * W : 0;
      run_steps(begin, t0, steps, keeps_chunk ? bf.states.data() + kept : nullptr, bf.decays.data() + kept);
    }
    for (int tile = tiles - 1; tile >= 0; --tile) {
      const int64_t t0 = begin + tile * kTile;
      const int steps = static_cast<int>(std::min<int64_t>(kTile, end - t0));
      const float* before_tile = bf.before_tile.data() + tile * n * W;
      const int64_t kept = keeps_chunk ? (t0 - begin) * n * W : 0;
      const float *states = bf.states.data() + kept, *decays = bf.decays.data() + kept;
      flags.load(p, b, t0, steps);
      if (!keeps_chunk) {
        std::copy(before_tile, before_tile + n * W, x);
        run_steps(begin, t0, steps, bf.states.data(), bf.decays.data());
      }
      const float *u_at = bf.u.data() + (t0 - begin) * W, *slope_at = bf.delta.data() + (t0 - begin) * W;
      const float *dt_at = bf.dt.data() + (t0 - begin) * W, *dtu_at = bf.dtu.data() + (t0 - begin) * W;
      gather<V, W>(d_out + t0, p.length, lanes, steps, bf.d_out.data());
      if (z) gather<V, W>(z + t0, p.length, lanes, steps, bf.z.data());
      // The per-step gradients that come before the state dims': the gate's, D's and the output sum's.
      for (int i = 0; i < steps; ++i) {
        const V u_i = load<V>(u_at + i * W), d_out_i = load<V>(bf.d_out.data() + i * W);
        V d_y = d_out_i;
        if (z) {
          V sum{};
          for (int64_t j = 0; j < n; ++j)
            sum = cpu::multiply_add(ch.C(j, t0 + i, C), load<V>(states + (i * n + j) * W), sum);
          const V z_i = load<V>(bf.z.data() + i * W), y = cpu::multiply_add(D, u_i, sum), s = sigmoid(z_i);
          d_y = d_out_i * (z_i * s);
          store(bf.d_z.data() + i * W, d_out_i * y * (s * (1.0f + z_i * (1.0f - s))));
        }
        d_D = cpu::multiply_add(d_y, u_i, d_D);
        store(bf.d_sum.data() + i * W, d_y);
      }
      for (int i = steps - 1; i >= 0; --i) {
        const int64_t t = t0 + i, s = flags.sequence[i];
        const V dt = load<V>(dt_at + i * W), dtu = load<V>(dtu_at + i * W);
        const V d_sum = load<V>(bf.d_sum.data() + i * W);
        V d_input{}, d_dt{};
        for (int64_t j = 0; j < n; ++j) {
          const V a = load<V>(decays + (i * n + j) * W), x_j = load<V>(states + (i * n + j) * W);
          const V adjoint = cpu::multiply_add(d_sum, ch.C(j, t, C),
                                              flags.ends[i] ? ch.state_of(p.d_last_state, s, j) : load<V>(g + j * W));
          const V before = flags.starts[i] ? ch.state_of(p.initial, s, j)
                           : i > 0         ? load<V>(states + ((i - 1) * n + j) * W)
                                           : load<V>(before_tile + j * W);
          const V d_decay_a = adjoint * before * a;  // d out / d (dt A)
          d_input = cpu::multiply_add(adjoint, ch.B(j, t, B), d_input);
          d_dt = cpu::multiply_add(d_decay_a, load<V>(A + j * W), d_dt);
          store(bf.d_A.data() + j * W, cpu::multiply_add(d_decay_a, dt, load<V>(bf.d_A.data() + j * W)));
          if (p.B.varying) store(bf.d_B_terms.data() + (j * kTile + i) * W, valid ? adjoint * dtu : V{});
          else store(bf.d_B.data() + j * W, cpu::multiply_add(adjoint, dtu, load<V>(bf.d_B.data() + j * W)));
          if (p.C.varying) store(bf.d_C_terms.data() + (j * kTile + i) * W, valid ? d_sum * x_j : V{});
          else store(bf.d_C.data() + j * W, cpu::multiply_add(d_sum, x_j, load<V>(bf.d_C.data() + j * W)));
          if (flags.starts[i]) {
            if (p.d_initial) ch.set_state(p.d_initial, s, j, a * adjoint);
            store(g + j * W, V{});
          } else {
            store(g + j * W, a * adjoint);
          }
        }
        const V d_u_i = cpu::multiply_add(d_input, dt, load<V>(bf.d_sum.data() + i * W) * D);
        d_dt = cpu::multiply_add(d_input, load<V>(u_at + i * W), d_dt);
        const V d_delta_i = d_dt * load<V>(slope_at + i * W);
        d_bias = d_bias + d_delta_i;
        store(bf.d_u.data() + i * W, d_u_i);
        store(bf.d_delta.data() + i * W, d_delta_i);
      }
      scatter<V, W>(bf.d_u.data(), p.length, lanes, steps, d_u + t0);
      scatter<V, W>(bf.d_delta.data(), p.length, lanes, steps, d_delta + t0);
      if (z) scatter<V, W>(bf.d_z.data(), p.length, lanes, steps, d_z + t0);
      if (d_B_rows) add_lane_sums<V, W>(bf.d_B_terms.data(), n, steps, p.length, d_B_rows + t0);
      if (d_C_rows) add_lane_sums<V, W>(bf.d_C_terms.data(), n, steps, p.length, d_C_rows + t0);
    }
  }
  p.sequences.for_each_empty(b, [&](int64_t s) {
    if (p.d_initial)
      for (int64_t j = 0; j < n; ++j) ch.set_state(p.d_initial, s, j, ch.state_of(p.d_last_state, s, j));
  });
  for (int l = 0; l < lanes; ++l) {
    const int64_t row = ch.row + l;
    for (int64_t j = 0; j < n; ++j) {
      static_cast<float*>(p.d_A)[row * n + j] = bf.d_A[j * W + l];
      if (!p.B.varying) static_cast<float*>(p.d_B)[row * n + j] = bf.d_B[j * W + l];
      if (!p.C.varying) static_cast<float*>(p.d_C)[row * n + j] = bf.d_C[j * W + l];
    }
    if (p.d_D) static_cast<float*>(p.d_D)[row] = d_D[l];
    if (p.d_delta_bias) static_cast<float*>(p.d_delta_bias)[row] = d_bias[l];
  }
}

}  // namespace linrec::ssm::lanes
