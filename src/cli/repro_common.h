// Shared pieces of the `moeforge repro ...` commands.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf::cli {

struct Outcome {
  std::vector<double> loss;  // validation loss per seed
  int64_t dead = 0, stored_experts = 0, expert_params = 0, vanilla_params = 0;
  double mean() const { return loss.empty() ? NAN : std::accumulate(loss.begin(), loss.end(), 0.0) / loss.size(); }
  double std() const;
};

// Trains one run, or reuses it when it finished with the same config, or resumes it when it
// stopped; returns its directory.
std::string run_variant(const Config& cfg);
inline std::string verdict(bool held) { return held ? "held" : "did not hold"; }

// The options every repro command has: --config, --out, --seeds, --quick, --set.
struct ReproArgs {
  std::string config, out;
  std::vector<std::string> sets;
  int64_t seeds = 2;
  bool quick = false;
};
void add_repro_options(CLI::App* cmd, ReproArgs& a);
// The base config: --config, then (with --quick) the quick overrides and one seed, then --set.
Config repro_base_config(ReproArgs& a, const std::vector<std::string>& quick_overrides);

void register_repro_latent(CLI::App* repro);  // cmd_repro_latent.cpp

}  // namespace mf::cli
