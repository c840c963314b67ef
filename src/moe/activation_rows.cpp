#include "moe/activation_rows.h"

#include <cmath>
#include <cstdint>

#include "core/exp_poly.h"
#include "core/simd.h"

namespace mf {
namespace {

// the derivative dA/dH of a GELU channel A = h Phi(h) (core/exp_poly.h): Phi(h) + h phi(h)
template <typename T>
MF_ALWAYS_INLINE T gelu_slope(T h, T phi) {
  return phi + h * exp_lanes(T(-0.5) * h * h) * T(0.39894228040143268);
}

template <typename T>
MF_ALWAYS_INLINE void rows_forward(const T* h, T* a, int64_t P, int64_t M, bool swiglu) {
  if (swiglu)
    for (int64_t p = 0; p < P; ++p) {
      const T *g = h + p * 2 * M, *u = g + M;
      T* out = a + p * M;
#pragma omp simd
      for (int64_t c = 0; c < M; ++c) out[c] = silu_times(g[c], u[c]);
    }
  else
    for (int64_t p = 0; p < P; ++p) {
      const T* x = h + p * M;
      T* out = a + p * M;
#pragma omp simd
      for (int64_t c = 0; c < M; ++c) out[c] = x[c] * gelu_phi(x[c]);
    }
}
MF_SIMD_FUNCTION(forward_kernel, rows_forward, (const float* h, float* a, int64_t P, int64_t M, bool swiglu),
                 (h, a, P, M, swiglu))
MF_SIMD_FUNCTION(forward_kernel, rows_forward, (const double* h, double* a, int64_t P, int64_t M, bool swiglu),
                 (h, a, P, M, swiglu))

template <typename T>
MF_ALWAYS_INLINE void rows_backward(const T* h, const T* gw, const T* w, T* dweight, T* wa, T* dh, int64_t P, int64_t M,
                                    bool swiglu) {
  const int64_t N = swiglu ? 2 * M : M;
  for (int64_t p = 0; p < P; ++p) {
    const T *hp = h + p * N, *gwp = gw + p * M;
    T *wap = wa + p * M, *dhp = dh + p * N;
    const T wp = w[p];
    T dot = 0;
    if (swiglu) {
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < M; ++c) {
        const T g = hp[c], u = hp[M + c], s = T(1) / logistic_denominator(g), silu = g * s, A = silu * u;
        const T dA = wp * gwp[c];
        dot += A * gwp[c];
        wap[c] = wp * A;
        dhp[c] = dA * u * s * (T(1) + g * (T(1) - s));
        dhp[M + c] = dA * silu;
      }
    } else {
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < M; ++c) {
        const T x = hp[c], phi = gelu_phi(x), A = x * phi;
        dot += A * gwp[c];
        wap[c] = wp * A;
        dhp[c] = wp * gwp[c] * gelu_slope(x, phi);
      }
    }
    dweight[p] = dot;
  }
}
MF_SIMD_FUNCTION(backward_kernel, rows_backward,
                 (const float* h, const float* gw, const float* w, float* dweight, float* wa, float* dh, int64_t P,
                  int64_t M, bool swiglu),
                 (h, gw, w, dweight, wa, dh, P, M, swiglu))
MF_SIMD_FUNCTION(backward_kernel, rows_backward,
                 (const double* h, const double* gw, const double* w, double* dweight, double* wa, double* dh,
                  int64_t P, int64_t M, bool swiglu),
                 (h, gw, w, dweight, wa, dh, P, M, swiglu))

void check_rows(const at::Tensor& t, int64_t P, int64_t width, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.scalar_type() == like.scalar_type() && t.dim() == 2 &&
                  t.size(0) == P && t.size(1) == width,
              "activation rows: ", name, " must be contiguous [", P, ", ", width,
              "] of the pre-activations' dtype, got ", t.sizes());
}

}  // namespace

void activation_forward_rows(const at::Tensor& h_PN, at::Tensor& a_PM, bool swiglu) {
  const int64_t P = h_PN.size(0), M = swiglu ? h_PN.size(1) / 2 : h_PN.size(1);
  check_rows(h_PN, P, swiglu ? 2 * M : M, h_PN, "h");
  check_rows(a_PM, P, M, h_PN, "a");
  AT_DISPATCH_FLOATING_TYPES(h_PN.scalar_type(), "activation_forward_rows", [&] {
    forward_kernel(h_PN.data_ptr<scalar_t>(), a_PM.data_ptr<scalar_t>(), P, M, swiglu);
  });
}

void activation_backward_rows(const at::Tensor& h_PN, const at::Tensor& gw_PM, const at::Tensor& w_P,
                              at::Tensor& dweight_P, at::Tensor& wa_PM, at::Tensor& dh_PN, bool swiglu) {
  const int64_t P = h_PN.size(0), M = swiglu ? h_PN.size(1) / 2 : h_PN.size(1), N = swiglu ? 2 * M : M;
  check_rows(h_PN, P, N, h_PN, "h");
  check_rows(gw_PM, P, M, h_PN, "gw");
  check_rows(wa_PM, P, M, h_PN, "wa");
  check_rows(dh_PN, P, N, h_PN, "dh");
  TORCH_CHECK(w_P.is_contiguous() && dweight_P.is_contiguous() && w_P.numel() == P && dweight_P.numel() == P &&
                  w_P.scalar_type() == h_PN.scalar_type() && dweight_P.scalar_type() == h_PN.scalar_type(),
              "activation rows: ", P, " pair weights and their gradient, contiguous, of the pre-activations' dtype");
  AT_DISPATCH_FLOATING_TYPES(h_PN.scalar_type(), "activation_backward_rows", [&] {
    backward_kernel(h_PN.data_ptr<scalar_t>(), gw_PM.data_ptr<scalar_t>(), w_P.data_ptr<scalar_t>(),
                    dweight_P.data_ptr<scalar_t>(), wa_PM.data_ptr<scalar_t>(), dh_PN.data_ptr<scalar_t>(), P, M,
                    swiglu);
  });
}

void activation_forward_rows(const float* h_PN, float* a_PM, int64_t P, int64_t M, bool swiglu) {
  forward_kernel(h_PN, a_PM, P, M, swiglu);
}

void activation_backward_rows(const float* h_PN, const float* gw_PM, const float* w_P, float* dweight_P, float* wa_PM,
                              float* dh_PN, int64_t P, int64_t M, bool swiglu) {
  backward_kernel(h_PN, gw_PM, w_P, dweight_P, wa_PM, dh_PN, P, M, swiglu);
}

}  // namespace mf
