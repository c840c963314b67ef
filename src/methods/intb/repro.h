// `moeforge repro intb`: IntBMoE against dense, top-2 MoE and SMEAR at matched total parameters
// on the LM corpus (or, with a ViT base config, on Fashion-MNIST), with the paper's ablations,
// the removal probe and recipe similarity of the trained model, and the cache's cost over E.
#pragma once
#include <functional>

#include "train/repro_runs.h"

namespace mf {

struct IntBReproOptions {
  bool ablations = true;  // the six ablation arms (each trained for every seed)
};

ReproResult intb_repro(ReproArgs args, const IntBReproOptions& opt);

// One arm of the comparison: overrides of the IntBMoE config and the integer width solved so
// that the arm has the IntBMoE model's parameters ("" = none).
struct IntBArm {
  std::string name, label;
  std::vector<std::string> sets;
  std::string match_key;
  int64_t lo = 1, hi = 1;
};
// IntBMoE, dense (SwiGLU; GELU with biases for a ViT), top-2 and SMEAR, then (with
// `ablations`) the six ablations.
std::vector<IntBArm> intb_arms(bool ablations, bool vision = false);

// Parameters of the config's whole model (LM or ViT).
int64_t total_parameters(const Config& cfg);
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
