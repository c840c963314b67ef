#include "methods/umoe/surgery.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <numeric>
#include <set>

namespace mf {
namespace {

// the survivors, most salient first (ties: lower index first): the round-robin order of parents
std::vector<int64_t> survivors_by_saliency(const LayerSaliency& s, const std::vector<int64_t>& pruned) {
  std::vector<int64_t> out;
  for (int64_t e = 0; e < static_cast<int64_t>(s.saliency.size()); ++e)
    if (!std::binary_search(pruned.begin(), pruned.end(), e)) out.push_back(e);
  std::stable_sort(out.begin(), out.end(), [&](int64_t a, int64_t b) { return s.saliency[a] > s.saliency[b]; });
  return out;
}

at::Tensor index_tensor(const std::vector<int64_t>& v) { return torch::tensor(at::ArrayRef<int64_t>(v), torch::kLong); }

}  // namespace

void check_surgery_options(const SurgeryOptions& opt, const std::vector<LayerSaliency>& saliency) {
  if (!(opt.prune > 0 && opt.prune < 1))
    throw std::invalid_argument(fmt::format("--prune must lie strictly between 0 and 1 (got {})", opt.prune));
  if (!(opt.sigma >= 0)) throw std::invalid_argument(fmt::format("--sigma must be >= 0 (got {})", opt.sigma));
  if (saliency.empty()) throw std::invalid_argument("UMoE surgery: no MoE layers (no saliency was measured)");
}

LayerSurgery plan_surgery(const LayerSaliency& s, const Config& cfg, const SurgeryOptions& opt) {
  const auto E = static_cast<int64_t>(s.saliency.size());
  LayerSurgery ls;
  ls.layer = s.layer;
  ls.pruned = lowest_saliency(s, opt.prune);
  const auto n = static_cast<int64_t>(ls.pruned.size());
  if (n == 0 || n == E)
    throw std::invalid_argument(
        fmt::format("--prune {} prunes {} of layer {}'s {} experts; it must prune at least one and keep one", opt.prune,
                    n, s.layer, E));
  const auto parents = survivors_by_saliency(s, ls.pruned);
  if (opt.prune_only) {
    ls.source = parents;
    std::sort(ls.source.begin(), ls.source.end());
    if (static_cast<int64_t>(ls.source.size()) < cfg.model.moe.top_k)
      throw std::invalid_argument(
          fmt::format("--prune-only keeps {} experts, fewer than top_k = {}", ls.source.size(), cfg.model.moe.top_k));
    return ls;
  }
  ls.source.resize(E);
  std::iota(ls.source.begin(), ls.source.end(), 0);
  for (int64_t j = 0; j < n; ++j) {
    const auto slot = ls.pruned[j], parent = parents[j % static_cast<int64_t>(parents.size())];
    ls.source[slot] = parent;
    ls.perturbed.insert(slot);
    if (!opt.one_sided) ls.perturbed.insert(parent);
  }
  return ls;
}

std::string surgery_prefix(int64_t layer) { return fmt::format("model.layers.{}.mlp.", layer); }

bool is_per_expert(const std::string& name, at::IntArrayRef shape, int64_t layer, int64_t experts) {
  const auto prefix = surgery_prefix(layer);
  return (name.rfind(prefix + "experts.", 0) == 0 || name.rfind(prefix + "gate.", 0) == 0) && !shape.empty() &&
         shape[0] == experts;
}

at::Tensor operate(const std::string& name, const at::Tensor& old, const LayerSurgery& ls, const SurgeryOptions& opt,
                   at::Generator& gen) {
  torch::NoGradGuard no_grad;
  const auto prefix = surgery_prefix(ls.layer);
  auto t = old.index_select(0, index_tensor(ls.source));  // a copy: survivors as they were, clones of parents
  const bool is_router = name == prefix + "gate.weight";
  // MLP matrices (one [rows, cols] per expert) and router rows get noise; biases are copied only
  if (opt.sigma > 0 && (is_router || (name.rfind(prefix + "experts.", 0) == 0 && old.dim() >= 3))) {
    const double router_std = is_router ? old.std().item<double>() : 0;
    for (auto e : ls.perturbed) {
      const double sd = is_router ? router_std : old[ls.source[e]].std().item<double>();
      auto row = t[e];
      row.add_(at::empty_like(row).normal_(0, 1, gen), opt.sigma * sd);
    }
  }
  return t;
}

SurgeryResult umoe_surgery(const std::map<std::string, at::Tensor>& tensors, const Config& cfg,
                           const std::vector<LayerSaliency>& saliency, const SurgeryOptions& opt) {
  check_surgery_options(opt, saliency);
  SurgeryResult r{tensors, cfg, {}};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  for (const auto& s : saliency) {
    const auto E = static_cast<int64_t>(s.saliency.size());
    const auto router = surgery_prefix(s.layer) + "gate.weight";
    auto rit = tensors.find(router);
    if (rit == tensors.end() || rit->second.dim() != 2 || rit->second.size(0) != E)
      throw std::invalid_argument(fmt::format("UMoE surgery: no router '{}' of {} rows", router, E));
    const auto ls = plan_surgery(s, cfg, opt);
    for (auto& [name, t] : tensors)  // in name order: the order the noise is drawn in
      if (is_per_expert(name, t.sizes(), s.layer, E)) r.tensors[name] = operate(name, t, ls, opt, gen);
    if (opt.prune_only) r.config.model.moe.num_experts = static_cast<int64_t>(ls.source.size());
    r.layers.push_back(ls);
  }
  return r;
}

nlohmann::json surgery_report(const SurgeryResult& r, const std::vector<LayerSaliency>& saliency,
                              const SurgeryOptions& opt) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const auto& l = r.layers[i];
    nlohmann::json j = {{"layer", l.layer},
                        {"saliency", saliency[i].saliency},
                        {"tokens", saliency[i].tokens},
                        {"pruned", l.pruned},
                        {"routed_share_of_pruned", pair_share(saliency[i], l.pruned)}};
    j[opt.prune_only ? "kept" : "parent"] = l.source;
    layers.push_back(j);
  }
  return {{"prune", opt.prune},         {"sigma", opt.sigma},           {"seed", opt.seed},
          {"one_sided", opt.one_sided}, {"prune_only", opt.prune_only}, {"layers", layers}};
}

}  // namespace mf
