#include "core/tiles_linear.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <vector>

#include "core/unit_gemm.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kPiece = 512;   // tokens a product of dW sums over
constexpr int64_t kMinRows = 32;  // fewer rows go to at::linear

// row i of the [rows, width] matrix at base, from column `first`
template <typename T>
std::vector<T*> rows_of(T* base, int64_t rows, int64_t width, int64_t first = 0) {
  std::vector<T*> out(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) out[i] = base + i * width + first;
  return out;
}

// out[t] = a[t] B (+ bias) for t < T, threads taking ranges of t (B: b(k, c) = b[c][k] when by_col)
void rows_product(int64_t T, int64_t cols, int64_t depth, const float* a, const float* b, bool by_col, float* out,
                  const float* bias = nullptr) {
  const auto b_rows = rows_of(b, by_col ? cols : depth, by_col ? depth : cols);
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    std::vector<float> ws(static_cast<size_t>(unit_gemm_workspace(depth)));
    const auto a_rows = rows_of(a + t0 * depth, t1 - t0, depth);
    const auto o_rows = rows_of(out + t0 * cols, t1 - t0, cols);
    unit_gemm({t1 - t0, cols, depth, a_rows.data(), false, b_rows.data(), by_col, o_rows.data(), nullptr, false, bias},
              ws.data());
  });
}

// dW (+)= dy^T x: threads take rows of dW, each summing over the tokens kPiece at a time
void weight_grad(const at::Tensor& dy_TE, const at::Tensor& x_TD, float* dw_ED, bool accumulate = false) {
  const int64_t T = x_TD.size(0), D = x_TD.size(1), E = dy_TE.size(1);
  const float* dy = dy_TE.data_ptr<float>();
  const float* x = x_TD.data_ptr<float>();
  at::parallel_for(0, E, 16, [&](int64_t e0, int64_t e1) {
    std::vector<float> ws(static_cast<size_t>(unit_gemm_workspace(kPiece)));
    const auto out = rows_of(dw_ED + e0 * D, e1 - e0, D);
    for (int64_t t0 = 0; t0 < T; t0 += kPiece) {
      const int64_t n = std::min(kPiece, T - t0);
      const auto a = rows_of(dy + t0 * E, n, E, e0);  // A^T's rows: dy's, from column e0
      const auto b = rows_of(x + t0 * D, n, D);
      unit_gemm({e1 - e0, D, n, a.data(), true, b.data(), false, out.data(), nullptr, accumulate || t0 > 0}, ws.data());
    }
  });
}

struct TilesLinear : public torch::autograd::Function<TilesLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    auto y = at::empty({x.size(0), w.size(0)}, x.options());
    rows_product(x.size(0), w.size(0), x.size(1), x.data_ptr<float>(), w.data_ptr<float>(), true, y.data_ptr<float>(),
                 b.numel() ? b.data_ptr<float>() : nullptr);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto dy = grads[0].contiguous();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = at::empty_like(x);
      rows_product(x.size(0), x.size(1), w.size(0), dy.data_ptr<float>(), w.data_ptr<float>(), false,
                   dx.data_ptr<float>());
    }
    if (ctx->needs_input_grad(1)) {
      dw = at::empty_like(w);
      weight_grad(dy, x, dw.data_ptr<float>());
    }
    if (ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db};
  }
};

bool applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const auto fp32 = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.is_cpu() && t.is_contiguous();
  };
  return x.dim() >= 2 && x.size(-1) > 0 && x.numel() / x.size(-1) >= kMinRows && unit_gemm_preferred(x) && fp32(w) &&
         (!b.defined() || fp32(b));
}

}  // namespace

void linear_grads_into(const at::Tensor& dy_TE, const at::Tensor& x_TD, const at::Tensor& w_ED, at::Tensor dx_TD,
                       at::Tensor dw_ED, bool accumulate) {
  const auto rows = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.is_contiguous(); };
  if (!applies(x_TD, w_ED, {}) || !rows(dy_TE) || !rows(dx_TD) || !rows(dw_ED)) {
    dx_TD.copy_(dy_TE.matmul(w_ED));
    accumulate ? dw_ED.addmm_(dy_TE.t(), x_TD) : dw_ED.copy_(dy_TE.t().mm(x_TD));
    return;
  }
  rows_product(x_TD.size(0), x_TD.size(1), w_ED.size(0), dy_TE.data_ptr<float>(), w_ED.data_ptr<float>(), false,
               dx_TD.data_ptr<float>());
  weight_grad(dy_TE, x_TD, dw_ED.data_ptr<float>(), accumulate);
}

at::Tensor tiles_linear(const at::Tensor& x, const at::Tensor& w_ED, const at::Tensor& b_E) {
  TORCH_CHECK(x.dim() >= 1 && w_ED.dim() == 2 && x.size(-1) == w_ED.size(1),
              "tiles_linear: need x [..., D] and W [E, D], got ", x.sizes(), " and ", w_ED.sizes());
  if (!applies(x, w_ED, b_E)) return at::linear(x, w_ED, b_E);
  auto sizes = x.sizes().vec();
  sizes.back() = w_ED.size(0);
  // no bias: an empty tensor (LibTorch 1.13's Function::apply wants every tensor argument defined)
  const auto b = b_E.defined() ? b_E : at::empty({0}, w_ED.options());
  return TilesLinear::apply(x.reshape({-1, x.size(-1)}).contiguous(), w_ED, b).view(sizes);
}

}  // namespace mf
