#include "moe/swiglu_rows.h"

#include <cmath>
#include <cstdint>

#include "core/simd.h"

namespace mf {
namespace {

// e^x as straight-line code that `omp simd` vectorises (glibc's vector exp needs -ffast-math):
// x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite: ln2 in two parts), e^r by Cephes' expf
// polynomial, 2^n built in the exponent bits; x clamped to the normal range. Float64 keeps std::exp.
MF_ALWAYS_INLINE float exp_lanes(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  const float nf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded: 1.5 * 2^23 drops the fraction
  const auto n = static_cast<int32_t>(nf);
  const float r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(float, (n + 127) << 23);
}
MF_ALWAYS_INLINE double exp_lanes(double x) { return std::exp(x); }

template <typename T>
MF_ALWAYS_INLINE void swiglu_rows_forward(const T* h, T* a, int64_t N, int64_t M) {
  for (int64_t p = 0; p < N; ++p) {
    const T *g = h + p * 2 * M, *u = g + M;
    T* out = a + p * M;
#pragma omp simd
    for (int64_t c = 0; c < M; ++c) out[c] = g[c] / (T(1) + exp_lanes(-g[c])) * u[c];
  }
}
MF_SIMD_FUNCTION(swiglu_forward_kernel, swiglu_rows_forward, (const float* h, float* a, int64_t N, int64_t M),
                 (h, a, N, M))
MF_SIMD_FUNCTION(swiglu_forward_kernel, swiglu_rows_forward, (const double* h, double* a, int64_t N, int64_t M),
                 (h, a, N, M))

template <typename T>
MF_ALWAYS_INLINE void swiglu_rows_backward(const T* h, const T* gw, const T* w, T* dweight, T* wa, T* dh, int64_t N,
                                           int64_t M) {
  for (int64_t p = 0; p < N; ++p) {
    const T *g = h + p * 2 * M, *u = g + M, *gwp = gw + p * M;
    T *wap = wa + p * M, *dg = dh + p * 2 * M, *du = dg + M;
    const T wp = w[p];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < M; ++c) {
      const T s = T(1) / (T(1) + exp_lanes(-g[c])), silu = g[c] * s, A = silu * u[c], dA = wp * gwp[c];
      dot += A * gwp[c];
      wap[c] = wp * A;
      du[c] = dA * silu;
      dg[c] = dA * u[c] * s * (T(1) + g[c] * (T(1) - s));
    }
    dweight[p] = dot;
  }
}
MF_SIMD_FUNCTION(swiglu_backward_kernel, swiglu_rows_backward,
                 (const float* h, const float* gw, const float* w, float* dweight, float* wa, float* dh, int64_t N,
                  int64_t M),
                 (h, gw, w, dweight, wa, dh, N, M))
MF_SIMD_FUNCTION(swiglu_backward_kernel, swiglu_rows_backward,
                 (const double* h, const double* gw, const double* w, double* dweight, double* wa, double* dh,
                  int64_t N, int64_t M),
                 (h, gw, w, dweight, wa, dh, N, M))

void check_rows(const at::Tensor& t, int64_t N, int64_t width, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type() && t.dim() == 2 &&
                  t.size(0) == N && t.size(1) == width,
              "swiglu rows: ", name, " must be contiguous [", N, ", ", width, "] of the pre-activations' dtype, got ",
              t.sizes());
}

}  // namespace

void swiglu_forward_rows(const at::Tensor& h_PN, at::Tensor& a_PM) {
  const int64_t N = h_PN.size(0), M = h_PN.size(1) / 2;
  check_rows(h_PN, N, 2 * M, h_PN, "h");
  check_rows(a_PM, N, M, h_PN, "a");
  AT_DISPATCH_FLOATING_TYPES(h_PN.scalar_type(), "swiglu_forward_rows", [&] {
    swiglu_forward_kernel(h_PN.data_ptr<scalar_t>(), a_PM.data_ptr<scalar_t>(), N, M);
  });
}

void swiglu_backward_rows(const at::Tensor& h_PN, const at::Tensor& gw_PM, const at::Tensor& w_P, at::Tensor& dweight_P,
                          at::Tensor& wa_PM, at::Tensor& dh_PN) {
  const int64_t N = h_PN.size(0), M = h_PN.size(1) / 2;
  check_rows(h_PN, N, 2 * M, h_PN, "h");
  check_rows(gw_PM, N, M, h_PN, "gw");
  check_rows(wa_PM, N, M, h_PN, "wa");
  check_rows(dh_PN, N, 2 * M, h_PN, "dh");
  TORCH_CHECK(w_P.is_contiguous() && dweight_P.is_contiguous() && w_P.numel() == N && dweight_P.numel() == N &&
                  w_P.scalar_type() == h_PN.scalar_type() && dweight_P.scalar_type() == h_PN.scalar_type(),
              "swiglu rows: ", N, " pair weights and their gradient, contiguous, of the pre-activations' dtype");
  AT_DISPATCH_FLOATING_TYPES(h_PN.scalar_type(), "swiglu_backward_rows", [&] {
    swiglu_backward_kernel(h_PN.data_ptr<scalar_t>(), gw_PM.data_ptr<scalar_t>(), w_P.data_ptr<scalar_t>(),
                           dweight_P.data_ptr<scalar_t>(), wa_PM.data_ptr<scalar_t>(), dh_PN.data_ptr<scalar_t>(), N,
                           M);
  });
}

}  // namespace mf
