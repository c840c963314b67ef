#include "model/fused_loss.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// loss = (1/N) sum_n [ lse_n - z_{n,t_n} ],  z = h W^T,  lse_n = log sum_v exp z_{n,v}
// dL/dz_{n,v} = (softmax(z_n)_v - [v = t_n]) / N,  dL/dh = dz W,  dL/dW = dz^T h
struct FusedLinearCrossEntropy : torch::autograd::Function<FusedLinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h_ND, const torch::Tensor& w_VD,
                               const torch::Tensor& t_N, int64_t chunk, bool grad) {
    const int64_t N = h_ND.size(0);
    auto loss = torch::zeros({}, h_ND.options());
    torch::Tensor dh_ND, dw_VD;
    if (grad) dh_ND = torch::empty_like(h_ND), dw_VD = torch::zeros_like(w_VD);
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t n = std::min(chunk, N - n0);
      const auto h_nD = h_ND.narrow(0, n0, n);
      const auto t_n = t_N.narrow(0, n0, n);
      auto z_nV = h_nD.matmul(w_VD.t());
      const auto lse_n = z_nV.logsumexp(1, /*keepdim=*/true);
      loss += (lse_n.squeeze(1) - z_nV.gather(1, t_n.unsqueeze(1)).squeeze(1)).sum();
      if (!grad) continue;
      auto dz_nV = z_nV.sub_(lse_n).exp_();  // softmax, in place of the logits
      dz_nV.scatter_add_(1, t_n.unsqueeze(1), torch::full({n, 1}, -1.0, dz_nV.options()));
      dz_nV.div_(static_cast<double>(N));
      dh_ND.narrow(0, n0, n).copy_(dz_nV.matmul(w_VD));
      dw_VD.addmm_(dz_nV.t(), h_nD);
    }
    ctx->save_for_backward({dh_ND, dw_VD});
    return loss / static_cast<double>(N);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grad[0];
    return {saved[0].defined() ? saved[0] * g : torch::Tensor(), saved[1].defined() ? saved[1] * g : torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_lm_loss(const torch::Tensor& hidden_ND, const torch::Tensor& head_VD,
                            const torch::Tensor& targets_N, int64_t chunk) {
  TORCH_CHECK(hidden_ND.dim() == 2 && head_VD.dim() == 2 && hidden_ND.size(1) == head_VD.size(1),
              "fused_lm_loss: hidden [N, D] and head [V, D] expected");
  TORCH_CHECK(targets_N.dim() == 1 && targets_N.size(0) == hidden_ND.size(0), "fused_lm_loss: targets [N] expected");
  if (chunk <= 0) chunk = std::max<int64_t>(1, (int64_t{1} << 26) / head_VD.size(0));  // 256 MB of logits
  auto h = hidden_ND, w = head_VD;
  if (h.scalar_type() != torch::kFloat64) h = h.to(torch::kFloat32), w = w.to(torch::kFloat32);
  // gradients are computed in the forward pass only when a backward can follow (not under no_grad)
  const bool grad = torch::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  return FusedLinearCrossEntropy::apply(h, w, targets_N, chunk, grad);
}

}  // namespace mf
