#include "model/fused_loss.h"

#include "core/bf16.h"
#include "core/tiles_linear.h"
#include "model/cross_entropy_rows.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// loss = (1/T) sum_n [ lse_t - z_{n,target_t} ],  z = h W^T,  lse_t = log sum_v exp z_{n,v}
// dL/dz_{n,v} = (softmax(z_n)_v - [v = target_t]) / T,  dL/dh = dz W,  dL/dW = dz^T h
struct FusedLinearCrossEntropy : torch::autograd::Function<FusedLinearCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h_TD, const torch::Tensor& w_VD,
                               const torch::Tensor& t_T, int64_t chunk, bool grad) {
    const int64_t T = h_TD.size(0);
    auto loss = torch::zeros({}, h_TD.options());
    torch::Tensor dh_TD, dw_VD;
    if (grad) dh_TD = torch::empty_like(h_TD), dw_VD = torch::zeros_like(w_VD);
    for (int64_t n0 = 0; n0 < T; n0 += chunk) {
      const int64_t n = std::min(chunk, T - n0);
      const auto h_tD = h_TD.narrow(0, n0, n);
      const auto target_t = t_T.narrow(0, n0, n);
      auto dz_tV = project(h_tD, w_VD);  // the logits, then in place their gradient
      loss += cross_entropy_rows_(dz_tV, target_t, 1.0 / static_cast<double>(T)).sum();
      if (!grad) continue;
      linear_grads_into(dz_tV, h_tD, w_VD, dh_TD.narrow(0, n0, n), dw_VD, n0 > 0);
    }
    ctx->save_for_backward({dh_TD, dw_VD});
    return loss / static_cast<double>(T);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grad[0];
    return {saved[0].defined() ? saved[0] * g : torch::Tensor(), saved[1].defined() ? saved[1] * g : torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_lm_loss(const torch::Tensor& hidden_TD, const torch::Tensor& head_VD,
                            const torch::Tensor& targets_T, int64_t chunk) {
  TORCH_CHECK(hidden_TD.dim() == 2 && head_VD.dim() == 2 && hidden_TD.size(1) == head_VD.size(1),
              "fused_lm_loss: hidden [T, D] and head [V, D] expected");
  TORCH_CHECK(targets_T.dim() == 1 && targets_T.size(0) == hidden_TD.size(0), "fused_lm_loss: targets [T] expected");
  if (chunk <= 0) chunk = std::max<int64_t>(1, (int64_t{1} << 26) / head_VD.size(0));  // 256 MB of logits
  auto h = hidden_TD, w = head_VD;
  if (h.scalar_type() != torch::kFloat64) h = h.to(torch::kFloat32);
  // gradients are computed in the forward pass only when a backward can follow (not under no_grad)
  const bool grad = torch::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  // a head held in bf16 or int8 is read as it is by project() (no float32 copy of it) unless a gradient needs it
  if (grad || !held_narrow(w.scalar_type())) w = widened(w, h.scalar_type()).to(h.scalar_type());
  return FusedLinearCrossEntropy::apply(h, w, targets_T, chunk, grad);
}

}  // namespace mf
