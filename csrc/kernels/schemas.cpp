// The linrec op schemas, declared once. Device kernels register in their own files
// (cpu/linrec_cpu.cpp, cuda/linrec_cuda.cpp); fake kernels and autograd in src/linrec/_ops.py.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(linrec, m) {
  // outputs[l] = coeffs[l] * outputs[l-1] + inputs[l] along the last dim, outputs[0] = inputs[0];
  // reverse=True runs from the last element to the first.
  // threads_per_sequence and vectors_per_thread force a CUDA kernel config (for tuning; the CPU
  // ignores them); 0 and 0 choose one per shape.
  m.def("forward(Tensor inputs, Tensor coeffs, bool reverse=False, int threads_per_sequence=0, "
        "int vectors_per_thread=0) -> Tensor");
  // Gradients of forward for the upstream gradient d_outputs, in one pass.
  m.def("backward(Tensor d_outputs, Tensor coeffs, Tensor outputs, bool reverse=False, int threads_per_sequence=0, "
        "int vectors_per_thread=0) -> (Tensor, Tensor)");
}
