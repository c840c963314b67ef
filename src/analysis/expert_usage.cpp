#include "analysis/expert_usage.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "model/moe_ffn.h"

namespace mf {
namespace {

// usage per stored expert: pools summed over their layers, private experts row by row
std::vector<int64_t> stored_usage(const ExpertUsage& u) {
  std::vector<int64_t> out;
  int64_t seen_group = -2;
  for (size_t r = 0; r < u.counts.size(); ++r) {
    if (u.group[r] < 0 || u.group[r] != seen_group) {
      out.insert(out.end(), u.counts[r].begin(), u.counts[r].end());
      seen_group = u.group[r];
    } else {
      auto base = out.end() - static_cast<std::ptrdiff_t>(u.counts[r].size());
      for (size_t e = 0; e < u.counts[r].size(); ++e) base[static_cast<std::ptrdiff_t>(e)] += u.counts[r][e];
    }
  }
  return out;
}

}  // namespace

double histogram_mean(const std::vector<int64_t>& hist) {
  double n = 0, sum = 0;
  for (size_t v = 0; v < hist.size(); ++v) {
    n += static_cast<double>(hist[v]);
    sum += static_cast<double>(v) * static_cast<double>(hist[v]);
  }
  return n > 0 ? sum / n : 0;
}

int64_t ExpertUsage::globally_dead() const {
  auto s = stored_usage(*this);
  return std::count(s.begin(), s.end(), int64_t{0});
}

int64_t ExpertUsage::stored_experts() const { return static_cast<int64_t>(stored_usage(*this).size()); }

std::vector<int64_t> ExpertUsage::most_used(size_t r, int64_t n) const {
  std::vector<int64_t> idx(counts[r].size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return counts[r][a] > counts[r][b]; });
  idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(n)));
  return idx;
}

nlohmann::json ExpertUsage::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t r = 0; r < counts.size(); ++r) {
    rows.push_back({{"layer", layers[r]}, {"group", group[r]}, {"counts", counts[r]}});
    for (auto& [name, hist] : token_counts[r])
      rows.back()[name] = {{"mean", histogram_mean(hist)}, {"histogram", hist}};
  }
  nlohmann::json j = {{"rows", rows},
                      {"stored_experts", stored_experts()},
                      {"globally_dead", globally_dead()},
                      {"stored_usage", stored_usage(*this)}};
  for (auto& d : loss) j["loss"][d.domain] = d.loss;
  j["loss_mean"] = mean_loss(loss);
  return j;
}

ExpertUsage ExpertUsage::from_json(const nlohmann::json& j) {
  ExpertUsage u;
  for (const auto& row : j.at("rows")) {
    u.layers.push_back(row.at("layer").get<int64_t>());
    u.group.push_back(row.at("group").get<int64_t>());
    u.counts.push_back(row.at("counts").get<std::vector<int64_t>>());
    auto& hists = u.token_counts.emplace_back();
    for (const auto& [name, v] : row.items())
      if (v.is_object() && v.contains("histogram")) hists[name] = v["histogram"].get<std::vector<int64_t>>();
  }
  const auto losses = j.value("loss", nlohmann::json::object());  // items() of a temporary would dangle
  for (const auto& [domain, loss] : losses.items()) u.loss.push_back({domain, loss.get<double>(), 0});
  return u;
}

ExpertUsage measure_expert_usage(const Evaluable& model, const std::string& split) {
  ExpertUsage u;
  auto moe = routing_slots(model.ffns);
  for (auto* m : moe) {
    u.layers.push_back(m->routing_layer());
    u.group.push_back(m->routing_group());
    u.counts.emplace_back(m->routed_units(), 0);
    u.token_counts.emplace_back();
  }
  u.loss = model.evaluate(split, [&] {
    for (size_t r = 0; r < moe.size(); ++r) {
      const auto stats = moe[r]->last_stats();
      auto& row = u.counts[r];
      row.resize(std::max(row.size(), stats.load.size()), 0);  // units may be (expert, block) pairs
      for (size_t e = 0; e < stats.load.size(); ++e) row[e] += stats.load[e];
      for (auto& c : stats.counts) {
        auto& hist = u.token_counts[r][c.name];
        hist.resize(std::max(hist.size(), c.histogram.size()), 0);
        for (size_t v = 0; v < c.histogram.size(); ++v) hist[v] += c.histogram[v];
      }
    }
  });
  return u;
}

std::vector<std::string> write_usage_pictures(const ExpertUsage& u, const std::string& prefix,
                                              const std::string& title) {
  std::vector<std::vector<double>> share;
  HeatmapOptions h;
  const bool pooled = !u.group.empty() && u.group[0] >= 0;
  for (size_t r = 0; r < u.counts.size(); ++r) {
    const double total = std::max<double>(1, std::accumulate(u.counts[r].begin(), u.counts[r].end(), 0.0));
    share.emplace_back();
    for (auto c : u.counts[r]) share.back().push_back(static_cast<double>(c) / total);
    h.row_labels.push_back(pooled && u.group.back() > 0 ? fmt::format("L{} g{}", u.layers[r], u.group[r])
                                                        : fmt::format("layer {}", u.layers[r]));
  }
  h.title = title + " — expert usage per layer";
  h.x_label = pooled ? "pool expert" : "expert (each layer's own)";
  h.y_label = "MoE layer";
  h.value_label = "share of row";
  std::vector<std::string> paths = {prefix + "_heatmap.svg", prefix + "_hist.svg", prefix + ".json"};
  write_file_atomic(paths[0], heatmap_svg(share, h));
  std::vector<double> stored;
  auto s = stored_usage(u);
  const double total = std::max<double>(1, std::accumulate(s.begin(), s.end(), 0.0));
  for (auto v : s) stored.push_back(static_cast<double>(v) / total);
  ChartOptions c{fmt::format("{} — usage per stored expert ({} of {} never used)", title, u.globally_dead(), s.size()),
                 pooled ? "pool expert" : "expert (grouped by layer)", "share of all routed pairs"};
  const auto groups = pooled ? static_cast<int64_t>(*std::max_element(u.group.begin(), u.group.end()) + 1)
                             : static_cast<int64_t>(u.counts.size());
  write_file_atomic(paths[1], bar_chart_svg(stored, c, groups));
  write_file_atomic(paths[2], u.to_json().dump(1) + "\n");
  return paths;
}

}  // namespace mf
