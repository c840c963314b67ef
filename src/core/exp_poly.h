// e^r for |r| <= ln2 / 2 by Cephes' expf polynomial (about 1 ulp), on a float or a GCC vector of
// floats: the part of e^x that the vector-extension kernels (moe/fused_units.cpp) and the plain
// `omp simd` loops (moe/activation_rows.cpp) share; each reduces x = n ln2 + r and builds 2^n its way.
#pragma once

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

}  // namespace mf
