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
  // along time ignore them); 0 and 0 choose one per shape.
  m.def("forward(Tensor inputs, Tensor coeffs, int dim=-1, bool reverse=False, Tensor? initial=None, "
        "Tensor? cu_seqlens=None, bool log_coeffs=False, int threads_per_sequence=0, int vectors_per_thread=0) "
        "-> Tensor");
  // Gradients of forward for the upstream gradient d_outputs, in one pass: (d_inputs, d_coeffs, d_initial),
  // d_coeffs in coeffs' shape and dtype, d_initial in initial's (empty when initial is None).
  m.def("backward(Tensor d_outputs, Tensor coeffs, Tensor outputs, int dim=-1, bool reverse=False, "
        "Tensor? initial=None, Tensor? cu_seqlens=None, bool log_coeffs=False, int threads_per_sequence=0, "
        "int vectors_per_thread=0) -> (Tensor, Tensor, Tensor)");
}
