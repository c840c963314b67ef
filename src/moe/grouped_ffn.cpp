#include "moe/grouped_ffn.h"

#include <torch/autograd.h>

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per expert e with rows X [n, D], W1 = gate_up[e], W2 = down[e]:
//   H = X W1^T            [n, 2F]   (G = H[:, :F], U = H[:, F:])
//   A = silu(G) * U       [n, F]    (gelu: A = gelu(H))
//   Y = A W2^T            [n, D]
// Backward from dY:
//   dW2 = dY^T A,  dA = dY W2,  dG = silu'(G) * U * dA,  dU = silu(G) * dA
//   dW1 = dH^T X,  dX = dH W1   with dH = [dG, dU]
struct GroupedFFN : public torch::autograd::Function<GroupedFFN> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& gate_up,
                            const at::Tensor& down, const std::vector<int64_t>& counts, bool swiglu) {
    const int64_t N = rows.size(0), D = rows.size(1), H2 = gate_up.size(1), F = down.size(2);
    auto h = at::empty({N, H2}, rows.options());
    auto a = at::empty({N, F}, rows.options());
    auto y = at::empty({N, D}, rows.options());
    int64_t off = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;
      auto x = rows.narrow(0, off, n), he = h.narrow(0, off, n), ae = a.narrow(0, off, n);
      at::mm_out(he, x, gate_up[e].t());
      if (swiglu) at::mul_out(ae, at::silu(he.narrow(1, 0, F)), he.narrow(1, F, F));
      else at::gelu_out(ae, he);
      auto ye = y.narrow(0, off, n);
      at::mm_out(ye, ae, down[e].t());
      off += n;
    }
    ctx->save_for_backward({rows, gate_up, down, h, a});
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
      at::mm_out(dw1e, dh.t(), x);
      at::mm_out(dxe, dh, gate_up[e]);
      off += n;
    }
    return {dx, dw1, dw2, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor grouped_ffn(const at::Tensor& rows, const at::Tensor& gate_up, const at::Tensor& down,
                       const std::vector<int64_t>& counts, bool swiglu) {
  return GroupedFFN::apply(rows.contiguous(), gate_up, down, counts, swiglu);
}

}  // namespace mf
