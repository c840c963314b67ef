#include "methods/unif/diagnostics.h"

#include <torch/torch.h>

#include <cmath>

namespace mf {

at::Tensor aligned_positions(const ExpertBank& bank, double delta) {
  auto v_EFD = bank.down_proj.detach().transpose(1, 2);  // V_e[h, :]
  auto unit_EFD = v_EFD / v_EFD.norm(2, -1, true).clamp_min(1e-30);
  auto cos_EEF = (unit_EFD.unsqueeze(1) * unit_EFD.unsqueeze(0)).sum(-1);
  return cos_EEF >= delta;
}

at::Tensor value_alignment(const ExpertBank& bank, double delta) {
  return aligned_positions(bank, delta).to(at::kDouble).mean(-1);
}

at::Tensor coactivation(const at::Tensor& token_P, const at::Tensor& unit_P, int64_t tokens, int64_t experts) {
  auto member_TE = at::zeros({tokens, experts}, at::TensorOptions().dtype(at::kDouble));
  member_TE.index_put_({token_P.cpu(), unit_P.cpu()}, at::ones({token_P.numel()}, member_TE.options()));
  return at::matmul(member_TE.t(), member_TE) / static_cast<double>(std::max<int64_t>(1, tokens));
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const auto n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : NAN;
}

ResidualSplit split_residual(const ExpertBank& bank, const at::Tensor& aligned_EEF, const at::Tensor& x_TD,
                             const at::Tensor& pair_T2, const at::Tensor& weights_T2) {
  torch::NoGradGuard no_grad;
  const int64_t F = bank.expert_hidden();
  auto x = x_TD.to(at::kDouble);
  auto w1 = bank.gate_up_proj.detach().to(at::kDouble);  // [E, 2F|F, D]
  auto h_TEN = at::einsum("td,ehd->teh", {x, w1});
  if (bank.gate_up_proj_bias.defined()) h_TEN = h_TEN + bank.gate_up_proj_bias.detach().to(at::kDouble);
  auto act_TEF = bank.activation() == Activation::SwiGLU ? at::silu(h_TEN.narrow(2, 0, F)) * h_TEN.narrow(2, F, F)
                                                         : at::gelu(h_TEN);
  auto v_EFD = bank.down_proj.detach().to(at::kDouble).transpose(1, 2);
  auto i_T = pair_T2.select(1, 0), j_T = pair_T2.select(1, 1);
  auto mask_TF = aligned_EEF.index({i_T, j_T}).to(at::kDouble);  // the token's pair's aligned positions
  ResidualSplit s;
  s.residual_TED = at::einsum("tef,tf,efd->ted", {act_TEF, 1 - mask_TF, v_EFD});
  auto shared_TED = at::einsum("tef,tf,efd->ted", {act_TEF, mask_TF, v_EFD});
  if (bank.down_proj_bias.defined()) shared_TED = shared_TED + bank.down_proj_bias.detach().to(at::kDouble);
  auto w = weights_T2.to(at::kDouble);
  w = w / w.sum(1, true);
  auto pick = [&](const at::Tensor& t_TED, int64_t c) {
    return t_TED.gather(1, pair_T2.select(1, c).view({-1, 1, 1}).expand({-1, 1, t_TED.size(2)})).squeeze(1);
  };
  s.shared_TD = w.select(1, 0).unsqueeze(1) * pick(shared_TED, 0) + w.select(1, 1).unsqueeze(1) * pick(shared_TED, 1);
  s.y_TD = s.shared_TD + w.select(1, 0).unsqueeze(1) * pick(s.residual_TED, 0) +
           w.select(1, 1).unsqueeze(1) * pick(s.residual_TED, 1);
  return s;
}

at::Tensor fit_residual_router(const at::Tensor& x_TD, const ResidualSplit& s, const at::Tensor& start, int64_t steps,
                               double lr) {
  auto x = x_TD.to(at::kDouble).detach();
  auto w = start.detach().to(at::kDouble).clone().requires_grad_(true);
  torch::optim::Adam opt({w}, torch::optim::AdamOptions(lr));
  const int64_t D = s.y_TD.size(1);
  for (int64_t i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto logits_TE = at::matmul(x, w.t());
    auto top_T2 = std::get<1>(logits_TE.detach().topk(2, 1));
    auto p_T2 = at::softmax(logits_TE.gather(1, top_T2), 1);
    auto r_T2D = s.residual_TED.gather(1, top_T2.unsqueeze(2).expand({-1, 2, D}));
    auto y = s.shared_TD + (p_T2.unsqueeze(2) * r_T2D).sum(1);
    (y - s.y_TD).pow(2).sum(1).mean().backward();
    opt.step();
  }
  return w.detach();
}

at::Tensor residual_demand(const ResidualSplit& s, const at::Tensor& order_TE, double eps) {
  torch::NoGradGuard no_grad;
  const int64_t T = s.y_TD.size(0), E = order_TE.size(1), D = s.y_TD.size(1);
  auto r_TD = s.y_TD - s.shared_TD;
  auto ordered_TED = s.residual_TED.gather(1, order_TE.unsqueeze(2).expand({-1, E, D}));
  auto k_T = at::full({T}, E + 1, at::TensorOptions().dtype(at::kLong));
  auto y_norm_T = s.y_TD.norm(2, 1).clamp_min(1e-12);
  for (int64_t m = E; m >= 1; --m) {  // downwards: the last one that passes is the smallest
    auto R_TmD = ordered_TED.narrow(1, 0, m);
    auto gram_Tmm = at::matmul(R_TmD, R_TmD.transpose(1, 2));
    auto gamma_T = 1e-6 * gram_Tmm.diagonal(0, 1, 2).sum(1) / static_cast<double>(m);
    auto eye = at::eye(m, gram_Tmm.options()).unsqueeze(0);
    auto rhs_Tm1 = at::matmul(R_TmD, r_TD.unsqueeze(2));
    auto a_Tm1 = at::linalg_solve(gram_Tmm + (gamma_T + 1e-30).view({-1, 1, 1}) * eye, rhs_Tm1);  // 1e-30: all-zero R
    auto y_hat_TD = s.shared_TD + at::matmul(a_Tm1.transpose(1, 2), R_TmD).squeeze(1);
    auto e_T = (y_hat_TD - s.y_TD).norm(2, 1) / y_norm_T;
    k_T = at::where(e_T <= eps, at::full_like(k_T, m), k_T);
  }
  return k_T;
}

}  // namespace mf

#include <fmt/format.h>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "model/moe_ffn.h"

namespace mf {

std::vector<LayerDiagnosis> diagnose_motivation(const Evaluable& model, const DiagnoseOptions& opt) {
  auto moe = moe_layers(model.ffns);
  if (moe.empty()) throw std::invalid_argument("diagnose: the model has no MoE layers");
  std::vector<std::vector<at::Tensor>> rows(moe.size()), tokens(moe.size()), units(moe.size()), weights(moe.size());
  std::vector<int64_t> seen(moe.size(), 0);
  for (size_t i = 0; i < moe.size(); ++i)
    moe[i]->dispatch_hook = [&, i](const at::Tensor& x, const RouterOutput& routed) {
      const auto& a = routed.assignment;
      if (seen[i] >= opt.tokens) return;
      rows[i].push_back(x.detach());
      tokens[i].push_back(a.token_P + seen[i]);
      units[i].push_back(a.unit_P);
      weights[i].push_back(a.weight_P.detach());
      seen[i] += a.num_tokens;
    };
  model.evaluate(opt.split, {});
  for (auto& m : moe) m->dispatch_hook = nullptr;
  std::vector<LayerDiagnosis> out;
  for (size_t i = 0; i < moe.size(); ++i) {
    const auto& bank = *moe[i]->experts;
    const int64_t E = bank.num_units(), T = seen[i];
    auto x_TD = at::cat(rows[i]);
    auto token_P = at::cat(tokens[i]), unit_P = at::cat(units[i]), weight_P = at::cat(weights[i]);
    LayerDiagnosis d;
    d.layer = moe[i]->layer;
    const auto aligned_EEF = aligned_positions(bank, opt.delta);
    auto rho_EE = aligned_EEF.to(at::kDouble).mean(-1), co_EE = coactivation(token_P, unit_P, T, E);
    for (int64_t a = 0; a < E; ++a)
      for (int64_t b = a + 1; b < E; ++b) {
        d.pairs.emplace_back(a, b);
        d.rho.push_back(rho_EE[a][b].item<double>());
        d.coactivation.push_back(co_EE[a][b].item<double>());
      }
    d.pearson = pearson(d.coactivation, d.rho);
    if (unit_P.numel() == 2 * T && moe[i]->gate->options().top_k == 2) {
      auto order_P = std::get<1>(token_P.sort(/*stable=*/true, 0, /*descending=*/false));  // pairs grouped by token
      auto pair_T2 = unit_P.index_select(0, order_P).view({T, 2}).cpu();
      auto w_T2 = weight_P.index_select(0, order_P).view({T, 2}).cpu();
      auto split = split_residual(bank, aligned_EEF, x_TD.cpu(), pair_T2, w_T2);
      auto router = fit_residual_router(x_TD.cpu(), split, moe[i]->gate->weight.cpu(), opt.fit_steps, opt.fit_lr);
      auto logits_TE = at::matmul(x_TD.cpu().to(at::kDouble), router.t());
      auto order_TE = std::get<1>(logits_TE.sort(/*stable=*/true, 1, /*descending=*/true));
      auto k_T = residual_demand(split, order_TE, opt.epsilon);
      d.k_histogram.assign(static_cast<size_t>(E + 1), 0);
      for (int64_t t = 0; t < T; ++t) ++d.k_histogram[static_cast<size_t>(k_T[t].item<int64_t>() - 1)];
      d.mean_k = k_T.to(at::kDouble).mean().item<double>();
      auto new_top2 = std::get<0>(order_TE.narrow(1, 0, 2).sort(1)), old_top2 = std::get<0>(pair_T2.sort(1));
      d.kept_top2 = (new_top2 == old_top2).all(1).to(at::kDouble).mean().item<double>();
      std::vector<double> rho, mean_k;  // pairs that some token used
      auto pair_id_T = std::get<0>(pair_T2.sort(1));
      for (size_t p = 0; p < d.pairs.size(); ++p) {
        auto mine = (pair_id_T.select(1, 0) == d.pairs[p].first) & (pair_id_T.select(1, 1) == d.pairs[p].second);
        if (mine.sum().item<int64_t>() == 0) continue;
        rho.push_back(d.rho[p]);
        mean_k.push_back(k_T.index({mine}).to(at::kDouble).mean().item<double>());
      }
      d.rho_vs_pair_k = pearson(rho, mean_k);
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<std::string> write_diagnosis(const std::vector<LayerDiagnosis>& d, const std::string& prefix,
                                         const std::string& title) {
  std::vector<Series> scatter, cdf;
  nlohmann::json js = nlohmann::json::array();
  for (auto& l : d) {
    scatter.push_back({fmt::format("block {} (r = {:.2f})", l.layer, l.pearson), l.coactivation, l.rho});
    scatter.back().points = true;
    nlohmann::json j = {{"layer", l.layer},
                        {"pearson_rho_vs_coactivation", l.pearson},
                        {"rho", l.rho},
                        {"coactivation", l.coactivation}};
    if (!l.k_histogram.empty()) {
      Series s;
      s.name = fmt::format("block {} (mean {:.2f})", l.layer, l.mean_k);
      double total = 0, n = 0;
      for (auto c : l.k_histogram) n += static_cast<double>(c);
      for (size_t m = 0; m < l.k_histogram.size(); ++m) {
        total += static_cast<double>(l.k_histogram[m]);
        s.x.push_back(static_cast<double>(m + 1));
        s.y.push_back(total / std::max(1.0, n));
      }
      cdf.push_back(s);
      j["k_eps_histogram"] = l.k_histogram;
      j["mean_k_eps"] = l.mean_k;
      j["kept_top2"] = l.kept_top2;
      j["pearson_rho_vs_pair_mean_k"] = l.rho_vs_pair_k;
    }
    js.push_back(j);
  }
  std::vector<std::string> paths = {prefix + "_alignment.svg", prefix + ".json"};
  write_file_atomic(paths[0], line_chart_svg(scatter, {title + " — value alignment vs co-activation per expert pair",
                                                       "co-activation frequency", "aligned share rho_ij"}));
  write_file_atomic(paths[1], js.dump(1) + "\n");
  if (!cdf.empty()) {
    paths.push_back(prefix + "_demand.svg");
    write_file_atomic(paths.back(),
                      line_chart_svg(cdf, {title + " — residual demand: Pr[k_eps <= m]",
                                           "m (residual experts, E + 1 = none suffices)", "share of tokens"}));
  }
  return paths;
}

}  // namespace mf
