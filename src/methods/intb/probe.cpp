#include "methods/intb/probe.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "methods/intb/intb.h"

namespace mf {

IntBProbe intb_probe(Evaluable& model, const std::string& split) {
  IntBProbe p;
  p.split = split;
  std::vector<IntBFeedForward*> slots;
  for (size_t i = 0; i < model.ffns.size(); ++i)
    if (auto* s = dynamic_cast<IntBFeedForward*>(model.ffns[i].get())) {
      slots.push_back(s);
      p.layers.push_back(static_cast<int64_t>(i));
    }
  if (slots.empty()) throw std::invalid_argument("the model has no IntBMoE slots (model.ffn = \"intb\")");
  if (slots.front()->options().baked)
    throw std::invalid_argument(
        "a baked IntBMoE checkpoint has no basis pool to probe; probe the one it was baked from");
  auto loss = [&] { return mean_loss(model.evaluate(split, {})); };
  p.loss = loss();
  torch::NoGradGuard g;
  for (auto* s : slots) {
    std::vector<double> row;
    for (int64_t e = 0; e < s->options().basis; ++e) {
      s->set_removed_basis(e);
      row.push_back(loss());
    }
    s->set_removed_basis(-1);
    p.removed.push_back(row);
    const auto c = s->compose();
    // each block's value recipe, the gate recipe beside it when there is one (A or 2A wide)
    auto recipe_EA = (c.alpha_gate_EA.defined() ? torch::cat({c.alpha_value_EA, c.alpha_gate_EA}, 1) : c.alpha_value_EA)
                         .to(torch::kDouble);
    auto unit_EA = recipe_EA / recipe_EA.norm(2, {1}, true).clamp_min(1e-30);
    auto cos_EE = unit_EA.matmul(unit_EA.t());
    std::vector<std::vector<double>> m(cos_EE.size(0), std::vector<double>(cos_EE.size(1)));
    for (int64_t a = 0; a < cos_EE.size(0); ++a)
      for (int64_t b = 0; b < cos_EE.size(1); ++b) m[a][b] = cos_EE[a][b].item<double>();
    p.similarity.push_back(m);
  }
  return p;
}

double IntBProbe::mean_similarity(size_t slot) const {
  const auto& m = similarity[slot];
  double sum = 0, n = 0;
  for (size_t a = 0; a < m.size(); ++a)
    for (size_t b = 0; b < m.size(); ++b)
      if (a != b) sum += m[a][b], n += 1;
  return n > 0 ? sum / n : 0.0;
}

std::string IntBProbe::markdown() const {
  std::string md = fmt::format(
      "{} loss of the intact model: {:.4f}\n\n| block | smallest cost | largest cost | "
      "bases that cost nothing (<= 0) | mean recipe cosine |\n|---|---|---|---|---|\n",
      split, loss);
  for (size_t i = 0; i < layers.size(); ++i) {
    double lo = 1e300, hi = -1e300;
    int64_t free = 0;
    for (double v : removed[i]) {
      lo = std::min(lo, v - loss), hi = std::max(hi, v - loss);
      free += v - loss <= 0;
    }
    md += fmt::format("| {} | {:+.4f} | {:+.4f} | {} of {} | {:.3f} |\n", layers[i], lo, hi, free, removed[i].size(),
                      mean_similarity(i));
  }
  return md;
}

nlohmann::json IntBProbe::to_json() const {
  nlohmann::json j = {{"split", split}, {"loss", loss}, {"slots", nlohmann::json::array()}};
  for (size_t i = 0; i < layers.size(); ++i)
    j["slots"].push_back({{"layer", layers[i]},
                          {"removed_loss", removed[i]},
                          {"recipe_cosine", similarity[i]},
                          {"mean_recipe_cosine", mean_similarity(i)}});
  return j;
}

IntBProbe IntBProbe::from_json(const nlohmann::json& j) {
  IntBProbe p;
  p.split = j["split"].get<std::string>();
  p.loss = j["loss"].get<double>();
  for (const auto& s : j["slots"]) {
    p.layers.push_back(s["layer"].get<int64_t>());
    p.removed.push_back(s["removed_loss"].get<std::vector<double>>());
    p.similarity.push_back(s["recipe_cosine"].get<std::vector<std::vector<double>>>());
  }
  return p;
}

std::vector<std::string> write_intb_probe(const IntBProbe& p, const std::string& prefix, const std::string& run) {
  std::vector<std::vector<double>> cost;
  HeatmapOptions h;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    std::vector<double> row;
    for (double v : p.removed[i]) row.push_back(std::max(0.0, v - p.loss));
    cost.push_back(row);
    h.row_labels.push_back(fmt::format("block {}", p.layers[i]));
  }
  h.title = fmt::format("{} — {} loss increase when one basis is removed", run, p.split);
  h.x_label = "basis e";
  h.y_label = "IntBMoE slot";
  h.value_label = "loss increase (nats; negatives shown as 0)";
  std::vector<std::string> paths = {prefix + "_removal.svg", prefix + "_similarity.svg"};
  write_file_atomic(paths[0], heatmap_svg(cost, h));
  std::vector<std::vector<double>> sim;
  HeatmapOptions s;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    std::vector<double> row;  // the upper triangle, pair by pair
    for (size_t a = 0; a < p.similarity[i].size(); ++a)
      for (size_t b = a + 1; b < p.similarity[i].size(); ++b) row.push_back(std::abs(p.similarity[i][a][b]));
    sim.push_back(row);
    s.row_labels.push_back(fmt::format("block {} (mean {:.2f})", p.layers[i], p.mean_similarity(i)));
  }
  s.title = fmt::format("{} — |cosine| of block recipes, every pair b < b'", run);
  s.x_label = "block pair (0,1), (0,2), ...";
  s.y_label = "IntBMoE slot";
  s.value_label = "|cos(recipe_b, recipe_b')|";
  s.vmax = 1;
  write_file_atomic(paths[1], heatmap_svg(sim, s));
  write_file_atomic(prefix + ".json", p.to_json().dump(2) + "\n");
  paths.push_back(prefix + ".json");
  return paths;
}

}  // namespace mf
