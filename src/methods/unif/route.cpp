#include "methods/unif/route.h"

namespace mf {

double unif_tau(int64_t blocks) {
  const auto B = static_cast<double>(blocks);
  return (B - 1) / (B * B);
}

UniFRouting unif_route(const at::Tensor& logits_TJ, const at::Tensor& priority_TB, const UniFOptions& opt) {
  const int64_t T = logits_TJ.size(0), K = logits_TJ.size(1) - 1, B = opt.blocks;
  const auto idx = logits_TJ.options().dtype(at::kLong);
  const double tau = unif_tau(B);
  UniFRouting r;
  r.alpha_T = opt.fixed_alpha > 0 ? at::full({T}, opt.fixed_alpha, logits_TJ.options())
                                  : tau + (1 - 2 * tau) * at::sigmoid(logits_TJ.select(1, 0));
  r.probs_TK = at::softmax(logits_TJ.narrow(1, 1, K), 1);
  auto alpha = r.alpha_T.detach();
  // b(x): rounding halves up; the clamp only matters where sigmoid saturates to exactly 0 or 1
  r.b_T = at::floor(alpha * static_cast<double>(B) + 0.5).to(at::kLong).clamp(1, B - 1);

  // what to share: the b(x) blocks of highest priority (ties: the lower block first)
  auto order_TB = opt.prefix_blocks ? at::arange(B, idx).expand({T, B})
                                    : std::get<1>(priority_TB.detach().sort(/*stable=*/true, 1, /*descending=*/true));
  auto first_TB = at::arange(B, idx).unsqueeze(0) < r.b_T.unsqueeze(1);  // by rank
  r.shared_TB = at::zeros({T, B}, idx.dtype(at::kBool)).scatter(1, order_TB, first_TB);

  // how many residual experts: the shortest prefix of p (descending) whose mass reaches 1 - alpha
  auto [sorted_TK, rank_order_TK] = r.probs_TK.detach().sort(/*stable=*/true, 1, /*descending=*/true);
  if (opt.residual_top_k > 0) {
    r.k_T = at::full({T}, std::min(opt.residual_top_k, K), idx);
  } else {
    auto before_TK = sorted_TK.cumsum(1) - sorted_TK;  // mass strictly before rank i
    r.k_T = (before_TK < (1 - alpha).unsqueeze(1)).sum(1).clamp(1, K);
  }
  auto take_TK = at::arange(K, idx).unsqueeze(0) < r.k_T.unsqueeze(1);
  r.chosen_TK = at::zeros({T, K}, idx.dtype(at::kBool)).scatter(1, rank_order_TK, take_TK);
  r.blocks_T = r.b_T + r.k_T * (B - r.b_T);

  // pairs, unit-major (dispatch needs no sort): shared (b, t) with weight alpha; residual
  // (j, b, t) on the complementary blocks with weight p_j
  auto shared = r.shared_TB.t().nonzero();  // [n, 2]: (block, token)
  auto s_block = shared.select(1, 0), s_token = shared.select(1, 1);
  auto residual = (r.chosen_TK.t().unsqueeze(1) & r.shared_TB.logical_not().t().unsqueeze(0)).nonzero();  // [m, 3]
  auto r_expert = residual.select(1, 0), r_block = residual.select(1, 1), r_token = residual.select(1, 2);
  auto& a = r.assignment;
  a.token_P = at::cat({s_token, r_token});
  a.unit_P = at::cat({s_block, (r_expert + 1) * B + r_block});
  a.weight_P = at::cat({r.alpha_T.index_select(0, s_token), r.probs_TK.index({r_token, r_expert})});
  a.sorted_by_unit = true;
  a.num_tokens = T;
  a.num_units = (K + 1) * B;
  r.weight_TJ = at::cat({r.alpha_T.unsqueeze(1), r.probs_TK * r.chosen_TK.to(r.probs_TK.dtype())}, 1);
  return r;
}

at::Tensor unif_diversity_loss(const at::Tensor& weight_JD) {
  auto gram_JJ = at::matmul(weight_JD, weight_JD.t());
  // the clamp keeps the gradient finite (zero) at an exactly orthonormal W
  return (gram_JJ - at::eye(weight_JD.size(0), weight_JD.options())).pow(2).sum().clamp_min(1e-30).sqrt();
}

}  // namespace mf
