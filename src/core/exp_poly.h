// e^r for |r| <= ln2 / 2 by Cephes' expf polynomial (about 1 ulp), on a float or a GCC vector of
// floats: the part of e^x that the vector-extension kernels (moe/fused_units.cpp) and the plain
// `omp simd` loops (exp_lanes below) share; each reduces x = n ln2 + r and builds 2^n its way.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/simd.h"

namespace mf {

template <typename V>
MF_ALWAYS_INLINE V exp_reduced(V r) {
  V y = r * 1.9875691500e-4f + 1.3981999507e-3f;  // Horner steps written out: a loop over the
  y = y * r + 8.3334519073e-3f;                   // coefficients kept GCC from vectorising the
  y = y * r + 4.1665795894e-2f;                   // `omp simd` loops around it
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  return y * r * r + r + 1.0f;
}

inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 in two parts (Cody-Waite)

// e^x as straight-line code that `omp simd` vectorises (glibc's vector exp needs -ffast-math):
// x clamped to the normal range, n = x / ln2 rounded (adding 1.5 * 2^23 drops the fraction), e^r
// by the polynomial above, 2^n built in the exponent bits. Float64 keeps std::exp.
MF_ALWAYS_INLINE float exp_in_range(float x) {  // x in [-87, 88]
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  return exp_reduced(x - n * kLn2Hi - n * kLn2Lo) * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}
MF_ALWAYS_INLINE float exp_lanes(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  return exp_in_range(x);
}
MF_ALWAYS_INLINE double exp_lanes(double x) { return std::exp(x); }

// 1 + e^-g, the logistic function's denominator (silu and its slope divide by it), e^-g as exp_lanes
// gives it but clamped in one test (|x - 0.5| > 87.5 for x = -g; NaN fails it and stays NaN). After
// exp_lanes's two tests GCC's jump threading copied the division into the clamped paths with e^x a
// constant, and the AVX2 and baseline variants divided twice, once by 1 + e^88 into denormals
// (SwiGLU rows forward 4x, backward 2-4x slower). Where no division follows, one test cost 7-19 %
// more than two (softmax rows, GELU), so exp_lanes keeps two.
MF_ALWAYS_INLINE float logistic_denominator(float g) {
  const float x = -g;
  return 1.0f + exp_in_range(__builtin_fabsf(x - 0.5f) > 87.5f ? 0.5f + __builtin_copysignf(87.5f, x - 0.5f) : x);
}
MF_ALWAYS_INLINE double logistic_denominator(double g) { return 1.0 + std::exp(-g); }

// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), as LibTorch's vectorised GELU;
// float64 keeps std::erf
MF_ALWAYS_INLINE float erf_lanes(float x) {
  const float a = x < 0 ? -x : x, t = 1.0f / (a * 0.3275911f + 1.0f);
  const float poly = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f;
  const float e = 1.0f - poly * t * exp_lanes(-(x * x));
  return x < 0 ? -e : e;
}
MF_ALWAYS_INLINE double erf_lanes(double x) { return std::erf(x); }

// The FFN activations one number at a time, for `omp simd` loops (moe/activation_rows, the decode
// engine): SwiGLU's silu(g) u, and GELU's Phi(h) (exact, through erf) so that GELU = h Phi(h).
template <typename T>
MF_ALWAYS_INLINE T silu_times(T g, T u) {
  return g / logistic_denominator(g) * u;
}
template <typename T>
MF_ALWAYS_INLINE T gelu_phi(T h) {
  return T(0.5) * (T(1) + erf_lanes(h * T(0.70710678118654752)));
}

}  // namespace mf
