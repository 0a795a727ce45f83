// The linrec op schemas, declared once. Device kernels register in their own files
// (cpu/linrec_cpu.cpp, cuda/linrec_cuda.cpp); fake kernels in src/linrec/_core/library.py, autograd in src/linrec/_core/autograd.py.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(linrec, m) {
  // outputs[l] = coeffs[l] * outputs[l-1] + inputs[l] along dim, from outputs[first] =
  // coeffs[first] * initial + inputs[first] (initial = 0 when None); reverse=True runs from the last
  // element to the first. coeffs broadcast to inputs; initial has inputs' shape without dim;
  // cu_seqlens packs sequences along dim (batch dim 0 of size 1), restarting at each boundary, with
  // initial's dim 0 counting them; log_coeffs: coeffs hold log c.
  // threads_per_sequence and vectors_per_thread force the tile shape of the CUDA kernels for
  // time-contiguous rows (for tuning: csrc/include/linrec/pipe/tile_shapes.inc lists them, the chained
  // shape chaining a sequence's tiles across blocks; the CPU, strided time and operands broadcast
  // along time ignore them, though on the GPU any forced shape keeps a call on the pipe family, whose
  // strided kernels then take strided time); 0 and 0 choose one per shape.
  m.def("forward(Tensor inputs, Tensor coeffs, int dim=-1, bool reverse=False, Tensor? initial=None, "
        "Tensor? cu_seqlens=None, bool log_coeffs=False, int threads_per_sequence=0, int vectors_per_thread=0) "
        "-> Tensor");
  // Gradients of forward for the upstream gradient d_outputs, in one pass: (d_inputs, d_coeffs, d_initial),
  // d_coeffs in coeffs' shape and dtype, d_initial in initial's (empty when initial is None).
  m.def("backward(Tensor d_outputs, Tensor coeffs, Tensor outputs, int dim=-1, bool reverse=False, "
        "Tensor? initial=None, Tensor? cu_seqlens=None, bool log_coeffs=False, int threads_per_sequence=0, "
        "int vectors_per_thread=0) -> (Tensor, Tensor, Tensor)");
  // Mamba's selective scan, fused: the state x (batch, d, n) runs x_t = exp(dt_t * A) * x_{t-1} + dt_t * B_t * u_t
  // from initial (zeros when None), dt = delta (+ delta_bias, through softplus when delta_softplus), and
  // out_t = (sum_n C_t * x_t + D * u_t) * silu(z_t); A real, or complex for a complex state.
  // Shapes and dtypes in csrc/include/linrec/ssm/params.h; every tensor contiguous. Returns (out, checkpoints,
  // last_state): checkpoints are the states every 512 steps that the backward recomputes from; last_state is the
  // state after each sequence's last step (its initial state when it has none).
  m.def("selective_scan_forward(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, "
        "Tensor? z=None, Tensor? delta_bias=None, bool delta_softplus=False, Tensor? initial=None, "
        "Tensor? cu_seqlens=None) -> (Tensor, Tensor, Tensor)");
  // One step of selective_scan_forward from each batch row's row of state (slots, d, n) (state_indices:
  // int32 or int64 (batch,), a negative entry or one past the rows a padded batch row, starting from
  // zeros and written nowhere; None: row b), the new state written back in place: u, delta and z
  // (batch, d, 1), B and C as selective_scan_forward takes them with a length of 1. Returns out.
  m.def("selective_state_update(Tensor(a!) state, Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, "
        "Tensor? D=None, Tensor? z=None, Tensor? delta_bias=None, bool delta_softplus=False, "
        "Tensor? state_indices=None) -> Tensor");
  // Gradients of selective_scan_forward for d_out and d_last_state (None: zero):
  // (d_u, d_delta, d_A, d_B, d_C, d_D, d_z, d_delta_bias, d_initial), empty for absent optional arguments.
  // deterministic: the same bits on every run (on the GPU, for varying B and C, only where B and C
  // vary with the same groups, n <= 64 and the state is float32; an error elsewhere).
  m.def("selective_scan_backward(Tensor d_out, Tensor? d_last_state, Tensor u, Tensor delta, Tensor A, Tensor B, "
        "Tensor C, Tensor? D, Tensor? z, Tensor? delta_bias, bool delta_softplus, Tensor? initial, "
        "Tensor? cu_seqlens, Tensor checkpoints, bool deterministic=False) -> (Tensor, Tensor, Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Mamba's causal depthwise convolution over time (width 1 to 4; linrec.causal_conv1d composes wider ones):
  // out[b, c, t] = act(bias[c] + sum_k weight[c, k] * x[b, c, t - (width - 1) + k]), act SiLU where silu, the
  // steps before a sequence's first reading initial_states (zeros when None); cu_seqlens packs sequences along
  // the length (batch 1). x contiguous; weight, bias and initial_states float32 (float64 beside float64 x).
  // Returns (out, final_states): the last width - 1 inputs of every sequence where return_final_states, else empty.
  m.def("causal_conv1d_forward(Tensor x, Tensor weight, Tensor? bias=None, bool silu=False, "
        "Tensor? initial_states=None, Tensor? cu_seqlens=None, bool return_final_states=False) -> (Tensor, Tensor)");
  // Gradients of causal_conv1d_forward for d_out and d_final_states (None: zero): (d_x, d_weight, d_bias,
  // d_initial_states), empty for absent optional arguments; deterministic.
  m.def("causal_conv1d_backward(Tensor d_out, Tensor? d_final_states, Tensor x, Tensor weight, Tensor? bias, "
        "bool silu, Tensor? initial_states, Tensor? cu_seqlens) -> (Tensor, Tensor, Tensor, Tensor)");
  // The decode step: x (batch, dim, steps) after each batch row's row of conv_state (slots, dim, state_len >=
  // width - 1; x's dtype or float32), which then holds the latest state_len inputs (conv_state_indices: int32 or
  // int64 (batch,), a negative entry or one past the rows a padded batch row, from zeros and written nowhere).
  m.def("causal_conv1d_update(Tensor(a!) conv_state, Tensor x, Tensor weight, Tensor? bias=None, bool silu=False, "
        "Tensor? conv_state_indices=None) -> Tensor");
}
