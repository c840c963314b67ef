// UniPool's routing-randomization probe (../shared/specs/unipool.md): replace one MoE layer's
// expert choice at a time by a uniform random draw and measure the held-out loss increase.
//   own:     among the layer's own experts (vanilla MoE)
//   pool:    among every expert of the layer's shared pool
//   matched: among the layer's E most-used experts on the usage split (E = model.moe.num_experts),
//            so a pooled layer draws from as many experts as a vanilla one
// The router's combine weights are kept; only the identity of the experts is randomized.
#pragma once
#include <nlohmann/json.hpp>

#include "train/evaluable.h"

namespace mf {

struct ProbeOptions {
  std::vector<int64_t> layers;      // block indices; empty = each deep-half MoE layer
  std::vector<std::string> modes;   // empty = own (private experts) or pool + matched (shared pools)
  std::string usage_split = "val";  // where "most used" is measured
  std::string eval_split = "test";  // where the loss is measured
  uint64_t seed = 1;
};

struct ProbeReport {
  double base_loss = 0;  // unmodified mean loss over domains
  struct Row {
    int64_t layer;
    std::string mode;
    double loss, delta;
  };
  std::vector<Row> rows;
  std::map<std::string, double> mean_delta;  // per mode, averaged over layers
  nlohmann::json to_json() const;
  static ProbeReport from_json(const nlohmann::json& j);
  std::string markdown() const;
};

// Works for every task: `model` is an LM with its corpus windows or a classifier with its images.
ProbeReport routing_probe(const Evaluable& model, const ProbeOptions& opt);

}  // namespace mf
