// `moeforge repro intb`: IntBMoE against dense, top-2 MoE and SMEAR at matched total parameters
// on the LM corpus, with the paper's ablations, the removal probe and recipe similarity of the
// trained model, and the cache's cost over E.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct IntBReproOptions {
  bool ablations = true;  // the six ablation arms (each trained for every seed)
};

ReproResult intb_repro(ReproArgs args, const IntBReproOptions& opt);

// The value of integer key `key` in [lo, hi] whose model has the total parameter count closest
// to `target` (binary search; parameters grow with the key). Throws ConfigError if none is valid.
int64_t match_parameters(Config cfg, const std::string& key, int64_t target, int64_t lo, int64_t hi);
int64_t total_parameters(const Config& cfg);

}  // namespace mf
