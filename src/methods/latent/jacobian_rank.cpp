#include "methods/latent/jacobian_rank.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>

namespace mf {

at::Tensor expert_jacobian(const ExpertBank& bank, int64_t e, const at::Tensor& z) {
  const int64_t m = bank.down_proj.size(2);
  auto Wg = bank.gate_up_proj[e].narrow(0, 0, m), Wu = bank.gate_up_proj[e].narrow(0, m, m), Wo = bank.down_proj[e];
  auto g = Wg.matmul(z), u = Wu.matmul(z), sg = torch::sigmoid(g);
  auto dsilu = sg * (1 + g * (1 - sg));  // d/dg [g sigmoid(g)]
  return Wo.matmul((dsilu * u).unsqueeze(1) * Wg + (g * sg).unsqueeze(1) * Wu);
}

int64_t numerical_rank(const at::Tensor& J, double rel_tol) {
  auto s = torch::linalg_svdvals(J.to(torch::kDouble));
  if (s.numel() == 0 || s[0].item<double>() == 0) return 0;
  return (s > rel_tol * s[0]).sum().item<int64_t>();
}

// Pair indices of `unit_P` taken round-robin over units (first pair of each used unit, then
// the second, ...), at most n.
static std::vector<int64_t> spread_over_units(const at::Tensor& unit_P, int64_t n) {
  auto units = unit_P.to(at::kCPU).contiguous();
  const auto* u = units.data_ptr<int64_t>();
  std::map<int64_t, std::vector<int64_t>> by_unit;
  for (int64_t p = 0; p < units.numel(); ++p) by_unit[u[p]].push_back(p);
  std::vector<int64_t> out;
  for (size_t round = 0; static_cast<int64_t>(out.size()) < n; ++round) {
    bool any = false;
    for (auto& [unit, pairs] : by_unit)
      if (round < pairs.size() && static_cast<int64_t>(out.size()) < n) {
        out.push_back(pairs[round]);
        any = true;
      }
    if (!any) break;
  }
  return out;
}

std::vector<LayerJacobianRank> jacobian_ranks(TransformerLM& model, const PreparedCorpus& corpus,
                                              const std::string& split, int64_t seq_len, int64_t samples,
                                              double rel_tol) {
  torch::NoGradGuard g;
  model->eval();
  auto moe = moe_layers(model->feed_forwards());
  std::vector<LayerJacobianRank> out(moe.size());
  std::vector<std::vector<double>> ranks(moe.size());
  const auto domains = static_cast<int64_t>(corpus.domains().size());
  const int64_t per_domain = std::max<int64_t>(1, (samples + domains - 1) / domains);
  for (size_t i = 0; i < moe.size(); ++i) {
    auto& m = *moe[i];
    out[i].layer = m.layer;
    out[i].q = std::min(m.experts->gate_up_proj.size(2), m.experts->down_proj.size(2));
    m.dispatch_hook = [&, i](const at::Tensor& rows, const RouterOutput& routed) {
      const auto& a = routed.assignment;
      for (auto p :
           spread_over_units(a.unit_P, std::min(per_domain, samples - static_cast<int64_t>(ranks[i].size())))) {
        auto J = expert_jacobian(*moe[i]->experts, a.unit_P[p].item<int64_t>(), rows[a.token_P[p].item<int64_t>()]);
        ranks[i].push_back(static_cast<double>(numerical_rank(J, rel_tol)) / static_cast<double>(out[i].q));
      }
    };
  }
  const int64_t windows = std::max<int64_t>(1, (per_domain + seq_len - 1) / seq_len);
  for (int64_t d = 0; d < domains; ++d) {
    auto batch = fixed_windows(corpus.tokens(static_cast<size_t>(d), split), seq_len, windows);
    model->forward(batch.inputs);
  }
  for (size_t i = 0; i < moe.size(); ++i) {
    moe[i]->dispatch_hook = nullptr;
    auto& r = ranks[i];
    out[i].samples = static_cast<int64_t>(r.size());
    if (r.empty()) continue;
    out[i].mean_rank = std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(r.size());
    out[i].min_rank = *std::min_element(r.begin(), r.end());
    out[i].max_rank = *std::max_element(r.begin(), r.end());
  }
  return out;
}

}  // namespace mf
