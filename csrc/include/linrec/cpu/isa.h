// The instruction set the CPU kernels run with, chosen at run time: one wheel serves every x86-64
// CPU, and AVX-512 or AVX2 is used where the CPU has it. Each variant is a function compiled for its
// target with everything it calls inlined into it (flatten), so the kernels' vector code is compiled
// once per target and no out-of-line function runs instructions the CPU may lack.
#pragma once

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace linrec::cpu {

enum class Isa { Baseline, Avx2, Avx512 };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Baseline: return "baseline";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

// The best the CPU has.
inline Isa best_cpu_isa() {
#if defined(__x86_64__)
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Isa::Avx2;
    return Isa::Baseline;
  }();
  return best;
#else
  return Isa::Baseline;
#endif
}

// The best the CPU has, or the one LINREC_CPU_ISA names (baseline, avx2 or avx512), which the CPU
// must have: the tests run every variant on one machine. Read on every call (a few nanoseconds
// beside an op call), so that a process may switch.
inline Isa cpu_isa() {
  const Isa best = best_cpu_isa();
  const char* requested = std::getenv("LINREC_CPU_ISA");
  if (requested == nullptr || *requested == '\0') return best;
  for (const Isa isa : {Isa::Baseline, Isa::Avx2, Isa::Avx512}) {
    if (std::strcmp(requested, isa_name(isa)) != 0) continue;
    if (isa > best)
      throw std::invalid_argument(std::string("linrec: LINREC_CPU_ISA: this CPU lacks ") + requested +
                                  " (the best it has is " + isa_name(best) + ")");
    return isa;
  }
  throw std::invalid_argument(std::string("linrec: LINREC_CPU_ISA must be baseline, avx2 or avx512, got '") + requested + "'");
}

#if defined(__x86_64__)
#define LINREC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2"), flatten))
#define LINREC_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi2"), flatten))

template <typename Body>
LINREC_TARGET_AVX512 void run_avx512(const Body& body) {
  body.template operator()<64>();
}

template <typename Body>
LINREC_TARGET_AVX2 void run_avx2(const Body& body) {
  body.template operator()<32>();
}
#endif

// The baseline: SSE2 on x86-64, NEON on aarch64 (both 16-byte vectors).
template <typename Body>
__attribute__((flatten)) void run_baseline(const Body& body) {
  body.template operator()<16>();
}

// Calls body.template operator()<Bytes>() compiled for `isa`, Bytes its vector width.
template <typename Body>
void with_vector_width(Isa isa, const Body& body) {
#if defined(__x86_64__)
  if (isa == Isa::Avx512) return run_avx512(body);
  if (isa == Isa::Avx2) return run_avx2(body);
#endif
  (void)isa;
  run_baseline(body);
}

}  // namespace linrec::cpu
