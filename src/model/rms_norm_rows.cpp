#include "model/rms_norm_rows.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>

#include "core/simd.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// rows per block of the weight's gradient: each block sums its own, then the blocks are summed in
// order, so dw does not depend on the thread count
constexpr int64_t kNormBlock = 128;

// rows [r0, r1) of x [rows, D]: y = x r w, r saved per row
template <typename T>
MF_ALWAYS_INLINE void norm_rows(const T* x, const T* w, int64_t r0, int64_t r1, int64_t D, T eps, T* y, T* inv) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    T squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t d = 0; d < D; ++d) squares += xr[d] * xr[d];
    const T k = T(1) / std::sqrt(squares / static_cast<T>(D) + eps);
    inv[r] = k;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * k * w[d];
  }
}
MF_SIMD_FUNCTION(norm_rows_kernel, norm_rows,
                 (const float* x, const float* w, int64_t r0, int64_t r1, int64_t D, float eps, float* y, float* inv),
                 (x, w, r0, r1, D, eps, y, inv))
MF_SIMD_FUNCTION(norm_rows_kernel, norm_rows,
                 (const double* x, const double* w, int64_t r0, int64_t r1, int64_t D, double eps, double* y,
                  double* inv),
                 (x, w, r0, r1, D, eps, y, inv))

// rows [r0, r1): dx (when not null) and dw += g x r (when not null)
template <typename T>
MF_ALWAYS_INLINE void norm_backward_rows(const T* x, const T* w, const T* inv, const T* g, int64_t r0, int64_t r1,
                                         int64_t D, T* dx, T* dw) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *xr = x + r * D, *gr = g + r * D;
    const T k = inv[r];
    if (dx) {
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += gr[d] * w[d] * xr[d];
      const T c = dot * k * k * k / static_cast<T>(D);
      T* dxr = dx + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dxr[d] = gr[d] * w[d] * k - xr[d] * c;
    }
    if (dw) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dw[d] += gr[d] * xr[d] * k;
    }
  }
}
MF_SIMD_FUNCTION(norm_backward_kernel, norm_backward_rows,
                 (const float* x, const float* w, const float* inv, const float* g, int64_t r0, int64_t r1, int64_t D,
                  float* dx, float* dw),
                 (x, w, inv, g, r0, r1, D, dx, dw))
MF_SIMD_FUNCTION(norm_backward_kernel, norm_backward_rows,
                 (const double* x, const double* w, const double* inv, const double* g, int64_t r0, int64_t r1,
                  int64_t D, double* dx, double* dw),
                 (x, w, inv, g, r0, r1, D, dx, dw))

int64_t grain(int64_t D) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, D)); }

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const int64_t D = x.size(-1), rows = D ? x.numel() / D : 0;
    auto y = at::empty_like(x), inv = at::empty({rows}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_rows", [&] {
      const scalar_t *xd = x.data_ptr<scalar_t>(), *wd = weight.data_ptr<scalar_t>();
      scalar_t *yd = y.data_ptr<scalar_t>(), *id = inv.data_ptr<scalar_t>();
      at::parallel_for(0, rows, grain(D), [&](int64_t r0, int64_t r1) {
        norm_rows_kernel(xd, wd, r0, r1, D, static_cast<scalar_t>(eps), yd, id);
      });
    });
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, weight, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &inv = saved[2];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto g = grads[0].contiguous();
    const int64_t D = x.size(-1), rows = inv.numel(), blocks = (rows + kNormBlock - 1) / kNormBlock;
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    auto dx = want_x ? at::empty_like(x) : at::Tensor();
    auto partial = want_w ? at::zeros({blocks, D}, x.options()) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_rows_backward", [&] {
      const scalar_t *xd = x.data_ptr<scalar_t>(), *wd = weight.data_ptr<scalar_t>();
      const scalar_t *id = inv.data_ptr<scalar_t>(), *gd = g.data_ptr<scalar_t>();
      scalar_t* dxd = want_x ? dx.data_ptr<scalar_t>() : nullptr;
      scalar_t* pd = want_w ? partial.data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, blocks, std::max<int64_t>(1, grain(D) / kNormBlock), [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b)
          norm_backward_kernel(xd, wd, id, gd, b * kNormBlock, std::min(rows, (b + 1) * kNormBlock), D, dxd,
                               pd ? pd + b * D : nullptr);
      });
    });
    return {dx, want_w ? partial.sum(0) : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool rms_norm_rows_applies(const at::Tensor& x, const at::Tensor& weight) {
  const auto dtype = x.scalar_type();
  return x.is_cpu() && weight.is_cpu() && (dtype == at::kFloat || dtype == at::kDouble) &&
         weight.scalar_type() == dtype && weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1);
}

at::Tensor rms_norm_composed(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto rms = at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return x * rms * weight;
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!rms_norm_rows_applies(x, weight)) return rms_norm_composed(x, weight, eps);
  return RmsNormFn::apply(x.contiguous(), weight.contiguous(), eps);
}

}  // namespace mf
