#include "moe/grouped_ffn.h"

#include <torch/autograd.h>

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per expert e with rows X [n, D] (n = counts_E[e]), W1 = gate_up[e], W2 = down[e]:
//   H = X W1^T (+ b1)     [n, 2F]   (G = H[:, :F], U = H[:, F:])
//   A = silu(G) * U       [n, F]    (gelu: A = gelu(H))
//   Y = A W2^T (+ b2)     [n, D]
// Backward from dY:
//   dW2 = dY^T A,  dA = dY W2,  dG = silu'(G) * U * dA,  dU = silu(G) * dA
//   dW1 = dH^T X,  dX = dH W1   with dH = [dG, dU];  db1 = sum_rows dH,  db2 = sum_rows dY
struct GroupedFFN : public torch::autograd::Function<GroupedFFN> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& gate_up,
                            const at::Tensor& down, const at::Tensor& b1, const at::Tensor& b2,
                            const std::vector<int64_t>& counts, bool swiglu) {
    const int64_t P = rows.size(0), D = rows.size(1), H2 = gate_up.size(1), F = down.size(2);
    auto h = at::empty({P, H2}, rows.options());
    auto a = at::empty({P, F}, rows.options());
    auto y = at::empty({P, D}, rows.options());
    int64_t off = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;
      auto x = rows.narrow(0, off, n), he = h.narrow(0, off, n), ae = a.narrow(0, off, n);
      at::mm_out(he, x, gate_up[e].t());
      if (b1.numel()) he.add_(b1[e]);
      if (swiglu)
        at::mul_out(ae, at::silu(he.narrow(1, 0, F)), he.narrow(1, F, F));
      else
        at::gelu_out(ae, he);
      auto ye = y.narrow(0, off, n);
      at::mm_out(ye, ae, down[e].t());
      if (b2.numel()) ye.add_(b2[e]);
      off += n;
    }
    ctx->save_for_backward({rows, gate_up, down, h, a});
    ctx->saved_data["b1"] = b1.numel() > 0;
    ctx->saved_data["b2"] = b2.numel() > 0;
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["swiglu"] = swiglu;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &rows = saved[0], &gate_up = saved[1], &down = saved[2], &h = saved[3], &a = saved[4];
    const auto counts = ctx->saved_data["counts"].toIntVector();
    const bool swiglu = ctx->saved_data["swiglu"].toBool();
    auto dy = grads[0].contiguous();
    const int64_t F = down.size(2);
    auto dx = at::empty_like(rows), dw1 = at::zeros_like(gate_up), dw2 = at::zeros_like(down);
    const bool has_b1 = ctx->saved_data["b1"].toBool(), has_b2 = ctx->saved_data["b2"].toBool();
    auto db1 = has_b1 ? at::zeros({gate_up.size(0), gate_up.size(1)}, dy.options()) : at::Tensor();
    auto db2 = has_b2 ? at::zeros({down.size(0), down.size(1)}, dy.options()) : at::Tensor();
    int64_t off = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;
      auto x = rows.narrow(0, off, n), he = h.narrow(0, off, n), ae = a.narrow(0, off, n), dye = dy.narrow(0, off, n);
      auto dw2e = dw2[e], dw1e = dw1[e], dxe = dx.narrow(0, off, n);
      at::mm_out(dw2e, dye.t(), ae);
      auto da = at::mm(dye, down[e]);
      at::Tensor dh;
      if (swiglu) {
        auto g = he.narrow(1, 0, F), u = he.narrow(1, F, F);
        dh = at::cat({at::silu_backward(da * u, g), da * at::silu(g)}, 1);
      } else {
        dh = at::gelu_backward(da, he);
      }
      if (has_b2) db2[e].copy_(dye.sum(0));
      if (has_b1) db1[e].copy_(dh.sum(0));
      at::mm_out(dw1e, dh.t(), x);
      at::mm_out(dxe, dh, gate_up[e]);
      off += n;
    }
    return {dx, dw1, dw2, db1, db2, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor grouped_ffn(const at::Tensor& rows_PD, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                       const at::Tensor& counts_E, bool swiglu, const at::Tensor& gate_up_bias,
                       const at::Tensor& down_bias) {
  auto host = counts_E.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> counts(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  // autograd::Function takes no undefined tensors: an empty one stands for "no bias"
  auto none = at::empty({0}, rows_PD.options());
  return GroupedFFN::apply(rows_PD.contiguous(), gate_up, down_EDF, gate_up_bias.defined() ? gate_up_bias : none,
                           down_bias.defined() ? down_bias : none, counts, swiglu);
}

}  // namespace mf
