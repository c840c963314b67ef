// Our CPU kernels' hot loops, compiled for several instruction sets and chosen at run time from
// the CPU's features. The build targets baseline x86-64 so the binary runs on any such CPU, which
// left these loops 4-wide SSE2 beside OpenBLAS's AVX-512 kernels. GCC's own target_clones
// dispatch was no help: its "arch=" clones test the CPU model, which this project's VMs report
// as generic (the OpenBLAS story again, see core/runtime.h), and its feature clones cannot ask
// for AVX-512 and FMA together. Lambdas do not inherit a target: the loop lives in the
// (forced inline) body that each variant below is compiled around.
#pragma once

namespace mf {

enum class SimdLevel { Base, Avx2, Avx512 };  // Avx2 = AVX2 + FMA; Avx512 = F, VL, BW, DQ + those
// This CPU's, by its feature flags; MOEFORGE_SIMD=base|avx2 caps it (to compare the variants).
SimdLevel simd_level();

}  // namespace mf

#if defined(__GNUC__)
#define MF_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define MF_ALWAYS_INLINE inline
#endif

#if defined(__x86_64__) && defined(__GNUC__)
// `void name params` running `body args` compiled for the best level this CPU has. Overloads
// (one per element type) are fine: each expansion declares its own three variants. The AVX-512
// variant uses 256-bit vectors: our rows are short (17-24 floats in the ViT's attention), and
// 512-bit ones ran that kernel slower than AVX2 (bench kernels: 3.6-3.9 vs 3.0-3.3 ms; 2.3 now).
#define MF_SIMD_FUNCTION(name, body, params, args)                                                                \
  __attribute__((                                                                                                 \
      target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=256"))) void name##_avx512 params { \
    body args;                                                                                                    \
  }                                                                                                               \
  __attribute__((target("avx2,fma"))) void name##_avx2 params { body args; }                                      \
  void name##_base params { body args; }                                                                          \
  void name params {                                                                                              \
    switch (::mf::simd_level()) {                                                                                 \
      case ::mf::SimdLevel::Avx512: return name##_avx512 args;                                                    \
      case ::mf::SimdLevel::Avx2: return name##_avx2 args;                                                        \
      default: return name##_base args;                                                                           \
    }                                                                                                             \
  }
#else
#define MF_SIMD_FUNCTION(name, body, params, args) \
  void name params { body args; }
#endif
