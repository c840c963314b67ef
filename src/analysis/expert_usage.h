// Which experts each MoE layer uses on held-out data: the layer x expert usage matrix
// (UniPool's main diagnostic: global collapse shows as a few dark columns), globally dead
// experts, and the pictures.
#pragma once
#include <nlohmann/json.hpp>

#include <map>

#include "train/evaluable.h"

namespace mf {

struct ExpertUsage {
  std::vector<int64_t> layers;               // block index of each row
  std::vector<int64_t> group;                // pool group of each row (-1: the layer's own experts)
  std::vector<std::vector<int64_t>> counts;  // [row][expert] routed pairs
  std::vector<DomainLoss> loss;              // the evaluation the usage was measured on
  // per row: the per-token counts a method reports (UniF-MoE: shared_blocks, residual_experts,
  // active_blocks), as histograms over the values 0, 1, ...
  std::vector<std::map<std::string, std::vector<int64_t>>> token_counts;

  // Experts no layer routed to: per pool (over its layers) or per (layer, expert).
  int64_t globally_dead() const;
  int64_t stored_experts() const;
  // The `n` experts row r used most (ties by index), for the cardinality-matched probe.
  std::vector<int64_t> most_used(size_t r, int64_t n) const;
  nlohmann::json to_json() const;
  static ExpertUsage from_json(const nlohmann::json& j);  // to_json's inverse (domain token counts aside)
};

double histogram_mean(const std::vector<int64_t>& hist);

// Routed pairs per (MoE layer, expert) while `model` is evaluated on `split`.
ExpertUsage measure_expert_usage(const Evaluable& model, const std::string& split);

// Writes PREFIX_heatmap.svg (row-normalized usage) and PREFIX_hist.svg (usage per stored
// expert, dead ones in red) and PREFIX.json; returns the paths written.
std::vector<std::string> write_usage_pictures(const ExpertUsage& u, const std::string& prefix,
                                              const std::string& title);

}  // namespace mf
