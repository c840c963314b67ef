#include "methods/unipool/probe.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>

#include "analysis/expert_usage.h"
#include "model/moe_ffn.h"
#include "train/evaluate.h"

namespace mf {

ProbeReport routing_probe(const Evaluable& model, const ProbeOptions& opt) {
  auto moe = moe_layers(model.ffns);
  if (moe.empty()) throw std::invalid_argument("routing probe: the model has no MoE layers");
  std::vector<int64_t> layers = opt.layers;
  if (layers.empty())
    for (size_t i = moe.size() / 2; i < moe.size(); ++i) layers.push_back(moe[i]->layer);
  const auto usage = measure_expert_usage(model, opt.usage_split);
  auto eval = [&] { return mean_loss(model.evaluate(opt.eval_split, {})); };
  ProbeReport rep;
  rep.base_loss = eval();
  const int64_t E = model.cfg.model.moe.num_experts;
  for (auto layer : layers) {
    auto it = std::find_if(moe.begin(), moe.end(), [&](auto& m) { return m->layer == layer; });
    if (it == moe.end()) throw std::invalid_argument(fmt::format("routing probe: block {} is not an MoE layer", layer));
    auto& m = **it;
    const size_t row = static_cast<size_t>(it - moe.begin());
    const bool pooled = m.bank_group >= 0 && std::count_if(moe.begin(), moe.end(),
                                                           [&](auto& o) { return o->bank_group == m.bank_group; }) > 1;
    auto modes = opt.modes;
    if (modes.empty()) modes = pooled ? std::vector<std::string>{"pool", "matched"} : std::vector<std::string>{"own"};
    for (auto& mode : modes) {
      MoEFeedForward::RandomRouting rr;
      rr.seed = opt.seed;
      if (mode == "matched") {
        rr.candidates = usage.most_used(row, E);
      } else if (mode == "own" || mode == "pool") {
        if ((mode == "own") == pooled)
          throw std::invalid_argument(fmt::format("routing probe: mode '{}' needs {} experts (block {})", mode,
                                                  mode == "own" ? "private" : "shared-pool", layer));
        rr.candidates.resize(m.experts->num_units());
        std::iota(rr.candidates.begin(), rr.candidates.end(), 0);
      } else {
        throw std::invalid_argument("routing probe: unknown mode '" + mode + "' (own, pool, matched)");
      }
      m.random_routing = rr;
      const double loss = eval();
      m.random_routing.reset();
      rep.rows.push_back({layer, mode, loss, loss - rep.base_loss});
      spdlog::info("probe block {} {}: loss {:.4f} ({:+.4f})", layer, mode, loss, loss - rep.base_loss);
    }
  }
  std::map<std::string, int> n;
  for (auto& r : rep.rows) {
    rep.mean_delta[r.mode] += r.delta;
    ++n[r.mode];
  }
  for (auto& [mode, v] : rep.mean_delta) v /= n[mode];
  return rep;
}

nlohmann::json ProbeReport::to_json() const {
  nlohmann::json j = {{"base_loss", base_loss}, {"mean_delta", mean_delta}, {"rows", nlohmann::json::array()}};
  for (auto& r : rows)
    j["rows"].push_back({{"layer", r.layer}, {"mode", r.mode}, {"loss", r.loss}, {"delta", r.delta}});
  return j;
}

ProbeReport ProbeReport::from_json(const nlohmann::json& j) {
  ProbeReport r;
  r.base_loss = j.at("base_loss").get<double>();
  r.mean_delta = j.at("mean_delta").get<std::map<std::string, double>>();
  for (const auto& row : j.at("rows"))
    r.rows.push_back({row.at("layer").get<int64_t>(), row.at("mode").get<std::string>(), row.at("loss").get<double>(),
                      row.at("delta").get<double>()});
  return r;
}

std::string ProbeReport::markdown() const {
  std::string s =
      fmt::format("unmodified loss: {:.4f}\n\n| block | mode | loss | increase |\n|---|---|---|---|\n", base_loss);
  for (auto& r : rows) s += fmt::format("| {} | {} | {:.4f} | {:+.4f} |\n", r.layer, r.mode, r.loss, r.delta);
  for (auto& [mode, v] : mean_delta) s += fmt::format("| mean | {} | | {:+.4f} |\n", mode, v);
  return s;
}

}  // namespace mf
