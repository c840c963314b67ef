// `moeforge repro unipool`: UniPool's ablation (paper Table 5) in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct UniPoolReproOptions {
  bool probe = true;      // the routing-randomization probe on vanilla and UniPool, every seed
  bool all_arms = false;  // also the per-layer-aux pool, unscaled pool, sigmoid, NormRouter-only and G = 2 arms
};

// Trains the arms (vanilla, vanilla x gate scale, shared pool + pool aux x gate scale, full
// UniPool, UniPool with half the pool; more with all_arms) for args.seeds seeds, measures expert
// usage (heatmaps into args.out) and the probe; returns results.json's content.
nlohmann::json unipool_repro(ReproArgs args, const UniPoolReproOptions& opt);
// results.md from that content alone.
std::string render_unipool_results(const nlohmann::json& results, const std::string& out_dir);

}  // namespace mf
