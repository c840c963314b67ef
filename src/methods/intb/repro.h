// `moeforge repro intb`: IntBMoE against the dense backbone, top-2 MoE and SMEAR in miniature on
// the LM corpus (or, with a ViT base config, on Fashion-MNIST): matched as the paper matches
// (Appendix A.3: every expert FFN-sized, E + 1 of them for a baseline without a shared path),
// and again at IntBMoE's total parameters; the paper's ablations, the removal probe over seeds
// and the cache's cost over E. results.json, rendered by render_intb_results().
#pragma once
#include <functional>

#include "train/repro_runs.h"

namespace mf {

struct IntBReproOptions {
  bool ablations = true;        // the six ablation arms
  int64_t secondary_seeds = 3;  // every arm but IntBMoE and top-2 (those: --seeds)
  int64_t probe_seeds = 3;      // IntBMoE seeds whose trained model the removal probe measures
};

nlohmann::json intb_repro(ReproArgs args, const IntBReproOptions& opt);
// results.md (and the pictures into out_dir) from that content alone.
std::string render_intb_results(const nlohmann::json& results, const std::string& out_dir);

// One arm: overrides of the IntBMoE base config and the integer width solved so that the arm
// has the IntBMoE model's total parameters ("" = none).
struct IntBArm {
  std::string name, label;
  std::vector<std::string> sets;
  std::string match_key;
  int64_t lo = 1, hi = 1;
  std::string group;  // paper (A.3 matching) | total (total parameters matched) | ablation
};
// IntBMoE; the dense backbone, top-2 and SMEAR with E + 1 experts of the backbone's FFN (group
// paper); dense, top-2 and SMEAR with 8 experts at IntBMoE's total parameters (group total);
// with `ablations` the six ablations. The backbone's FFN: GELU with biases for a ViT, SwiGLU
// for the LM, of width model.ffn_hidden; the MoE blocks: the base's model.moe.layers.
std::vector<IntBArm> intb_arms(const Config& base, bool ablations);

// Parameters of the config's whole model (LM or ViT).
int64_t total_parameters(const Config& cfg);
// Parameters multiplied per token (the paper's "activated"): the trainer's active count (k of E
// routed experts) with SMEAR's slots at one merged expert and IntBMoE's at its executed
// parameters with the cache (router, filter, k composed blocks, shared expert).
int64_t executed_parameters(const Config& cfg);
using ParameterCount = std::function<int64_t(const Config&)>;
// The value of integer key `key` in [lo, hi] whose parameter count (`count`, default the whole
// model's) is closest to `target` (binary search; the count grows with the key). Throws
// ConfigError if a value is invalid.
int64_t match_parameters(Config cfg, const std::string& key, int64_t target, int64_t lo, int64_t hi,
                         const ParameterCount& count = total_parameters);
// `cfg` with arm's overrides and its width solved against `count`, validated.
Config arm_config(const Config& base, const IntBArm& arm, int64_t target,
                  const ParameterCount& count = total_parameters);

}  // namespace mf
