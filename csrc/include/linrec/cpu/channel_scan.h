// CPU kernels for sequences whose time dim is strided and whose neighbouring sequences are adjacent
// in memory (time in the middle: (batch, time, channels)): the lanes of a vector are neighbouring
// channels, each its own recurrence, and a step of time is one vector load per operand. A thread takes
// kChannelVectors vectors of channels at a time, so that each step reads whole cache lines.
#pragma once

#include <cstdint>

#include "linrec/cpu/vector.h"

namespace linrec::cpu {

// Vectors of neighbouring channels one thread scans at most (1 KB of float32 per step with
// AVX-512): a step of a group then reads whole runs of lines, which the hardware prefetchers follow;
// groups of 4 vectors ran at half the speed. Fewer when there would be fewer groups than threads.
constexpr int kChannelVectors = 16;
// Steps ahead whose operands are prefetched in software, which made the strided steps faster still.
constexpr int64_t kPrefetchSteps = 4;

// T is the element type of inputs and outputs (and their gradients), C that of coeffs and initial (and
// theirs: T, or float for 16-bit T, which shares T's accumulator).
template <typename T, typename C, int Bytes, bool LogCoeffs>
struct ChannelScan {
  using A = Acc<T>;
  using V = typename Vector<A, Bytes>::Values;
  static constexpr int W = Vector<A, Bytes>::kLanes;
  static constexpr int kLanesPerGroup = W * kChannelVectors;

  // One operand seen from a group of channels: channel k of the group at step t is
  // data[t * time_stride + k] (unit) or data[t * time_stride] (one value shared by the channels).
  template <typename Pointer>
  struct Channels {
    Pointer data;
    int64_t time_stride;
    bool unit;
  };

  // The group's channels [0, channels) split into vectors: vector v holds lanes [0, count(v)).
  static int count(int channels, int v) {
    const int left = channels - v * W;
    return left >= W ? W : left > 0 ? left : 0;
  }

  template <typename Pointer>
  static V load_step(Channels<Pointer> operand, int64_t t, int v, int lanes) {
    const Pointer at = operand.data + t * operand.time_stride;
    return operand.unit ? load<V>(at + v * W, 0, lanes, A(0)) : load_splat<V>(at);
  }

  // Asks for the lines of step t of `operand` (when t is in [lo, hi)), to be read, or written.
  template <int Write, typename Pointer>
  static void prefetch_step(Channels<Pointer> operand, int64_t t, int64_t lo, int64_t hi, int channels) {
    if (t < lo || t >= hi || !operand.unit) return;
    const Pointer at = operand.data + t * operand.time_stride;
    // In the operand's own element type: float32 coefficients beside 16-bit inputs span twice the lines.
    constexpr int kElementsPerLine = 64 / static_cast<int>(sizeof(*at));
    for (int lane = 0; lane < channels; lane += kElementsPerLine) __builtin_prefetch(at + lane, Write);
  }

  static V coefficient(V stored) {
    if constexpr (LogCoeffs) return exp(stored);
    else return stored;
  }

  // Steps [lo, hi) of `channels` neighbouring sequences (at most kLanesPerGroup), in reverse order
  // when `reverse`; `initial` (unit stride across channels) or none.
  static void forward(Channels<const T*> inputs, Channels<const C*> coeffs, Channels<T*> outputs, const C* initial,
                      int channels, int64_t lo, int64_t hi, bool reverse) {
    if (hi <= lo) return;
    V state[kChannelVectors];
    int lanes[kChannelVectors];
    for (int v = 0; v < kChannelVectors; ++v) {
      lanes[v] = count(channels, v);
      state[v] = initial != nullptr ? load<V>(initial + v * W, 0, lanes[v], A(0)) : V{};
    }
    const int64_t step = reverse ? -1 : 1;
    int64_t t = reverse ? hi - 1 : lo;
    if (initial == nullptr) {  // the first step is its input: its coefficient takes no part
      for (int v = 0; v < kChannelVectors; ++v)
        if (lanes[v] > 0) {
          state[v] = load_step(inputs, t, v, lanes[v]);
          store(outputs.data + t * outputs.time_stride + v * W, state[v], 0, lanes[v]);
        }
      t += step;
    }
    for (; t >= lo && t < hi; t += step) {
      const int64_t ahead = t + kPrefetchSteps * step;
      prefetch_step<0>(inputs, ahead, lo, hi, channels);
      prefetch_step<0>(coeffs, ahead, lo, hi, channels);
      prefetch_step<1>(outputs, ahead, lo, hi, channels);
      for (int v = 0; v < kChannelVectors; ++v)
        if (lanes[v] > 0) {
          state[v] = multiply_add(coefficient(load_step(coeffs, t, v, lanes[v])), state[v], load_step(inputs, t, v, lanes[v]));
          store(outputs.data + t * outputs.time_stride + v * W, state[v], 0, lanes[v]);
        }
    }
  }

  // The gradients of forward() (the recurrence in params.h's BackwardParams), against its order.
  static void backward(Channels<const T*> d_outputs, Channels<const C*> coeffs, Channels<const T*> outputs,
                       Channels<T*> d_inputs, Channels<C*> d_coeffs, const C* initial, C* d_initial, int channels,
                       int64_t lo, int64_t hi, bool reverse) {
    if (hi <= lo) return;
    V d_state[kChannelVectors], next_coeff[kChannelVectors];
    int lanes[kChannelVectors];
    for (int v = 0; v < kChannelVectors; ++v) {
      lanes[v] = count(channels, v);
      d_state[v] = next_coeff[v] = V{};
    }
    const int64_t step = reverse ? 1 : -1;  // against the forward scan
    const int64_t first = reverse ? hi - 1 : lo;  // the forward's first step
    for (int64_t t = reverse ? lo : hi - 1; t >= lo && t < hi; t += step) {
      const int64_t ahead = t + kPrefetchSteps * step;
      prefetch_step<0>(d_outputs, ahead, lo, hi, channels);
      prefetch_step<0>(coeffs, ahead, lo, hi, channels);
      prefetch_step<0>(outputs, ahead, lo, hi, channels);
      prefetch_step<1>(d_inputs, ahead, lo, hi, channels);
      prefetch_step<1>(d_coeffs, ahead, lo, hi, channels);
      for (int v = 0; v < kChannelVectors; ++v) {
        if (lanes[v] == 0) continue;
        d_state[v] = multiply_add(next_coeff[v], d_state[v], load_step(d_outputs, t, v, lanes[v]));
        const V coeff = coefficient(load_step(coeffs, t, v, lanes[v]));
        store(d_inputs.data + t * d_inputs.time_stride + v * W, d_state[v], 0, lanes[v]);
        V d_coeff{};  // the first coefficient takes no part without an initial state
        if (t != first || initial != nullptr) {
          const V previous = t != first ? load_step(outputs, t + step, v, lanes[v]) : load<V>(initial + v * W, 0, lanes[v], A(0));
          d_coeff = d_state[v] * previous;
          if constexpr (LogCoeffs) d_coeff = d_coeff * coeff;
        }
        store(d_coeffs.data + t * d_coeffs.time_stride + v * W, d_coeff, 0, lanes[v]);
        next_coeff[v] = coeff;
      }
    }
    if (d_initial != nullptr)
      for (int v = 0; v < kChannelVectors; ++v)
        if (lanes[v] > 0) store(d_initial + v * W, next_coeff[v] * d_state[v], 0, lanes[v]);
  }
};

}  // namespace linrec::cpu
