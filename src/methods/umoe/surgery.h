// UMoE's budget-preserving expert surgery (../shared/specs/umoe.md, steps 2-4) on named
// tensors, so any source of MoE weights with these names plugs in (our checkpoints; Hugging
// Face ones once their names are mapped):
//   <prefix>experts.*   every tensor whose first dimension is the expert index E
//   <prefix>gate.weight the router [E, D]; <prefix>gate.* tensors of first dimension E
//                       (a selection bias) are per-expert too
// with <prefix> = "model.layers.<l>.mlp." for every MoE block l. Shared experts are untouched.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "methods/umoe/saliency.h"

namespace mf {

struct SurgeryOptions {
  double prune = 0.5;       // fraction of each layer's experts pruned: floor(E * prune), in (0, 1)
  double sigma = 0.05;      // W' = W + sigma * s(W) * eps
  uint64_t seed = 0;        // the noise
  bool one_sided = false;   // perturb only the clones (the paper's ablation)
  bool prune_only = false;  // drop the pruned experts and refill nothing (REAP's own use)
};

struct LayerSurgery {
  int64_t layer = 0;
  std::vector<int64_t> pruned;  // expert indices freed, ascending
  // slot -> where its weights came from: its own index for survivors; the parent for a refilled
  // slot; with prune_only, the old index of each kept expert
  std::vector<int64_t> source;
  std::set<int64_t> perturbed;  // slots that get noise (parents and clones; clones only if one-sided)
};

struct SurgeryResult {
  std::map<std::string, at::Tensor> tensors;
  Config config;  // unchanged, except model.moe.num_experts with prune_only
  std::vector<LayerSurgery> layers;
};

// Throws std::invalid_argument for a prune ratio outside (0, 1), a ratio that prunes no expert
// or all of them (or, with prune_only, fewer experts than top_k), saliency for other layers, or
// a missing router tensor.
SurgeryResult umoe_surgery(const std::map<std::string, at::Tensor>& tensors, const Config& cfg,
                           const std::vector<LayerSaliency>& saliency, const SurgeryOptions& opt);

// The same, one tensor at a time (the streamed `umoe` command): check the options, plan each MoE
// layer, then `operate` on each of its per-expert tensors (`is_per_expert`) in name order, layer
// after layer in saliency order, drawing the noise from one generator seeded with opt.seed.
void check_surgery_options(const SurgeryOptions& opt, const std::vector<LayerSaliency>& saliency);
LayerSurgery plan_surgery(const LayerSaliency& s, const Config& cfg, const SurgeryOptions& opt);
std::string surgery_prefix(int64_t layer);  // "model.layers.<l>.mlp."
bool is_per_expert(const std::string& name, at::IntArrayRef shape, int64_t layer, int64_t experts);
at::Tensor operate(const std::string& name, const at::Tensor& old, const LayerSurgery& ls, const SurgeryOptions& opt,
                   at::Generator& gen);

nlohmann::json surgery_report(const SurgeryResult& r, const std::vector<LayerSaliency>& saliency,
                              const SurgeryOptions& opt);

}  // namespace mf
