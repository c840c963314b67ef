// Shared pieces of the miniature reproductions (src/methods/*/repro.cpp): the base config,
// training or reusing one run per arm and seed, and the results every driver returns.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/config.h"
#include "train/repro_stats.h"

namespace mf {

struct Outcome {
  std::vector<double> loss;  // validation loss per seed
  int64_t dead = 0, stored_experts = 0, expert_params = 0, vanilla_params = 0;
  double mean() const { return loss.empty() ? NAN : std::accumulate(loss.begin(), loss.end(), 0.0) / loss.size(); }
  double std() const;
};

// Trains one run, or reuses it when it finished with the same config, or resumes it when it
// stopped; returns its directory. A fresh run starts from `init_from`'s weights when given.
std::string run_variant(const Config& cfg, const std::string& init_from = "");
// Every run directory run_variant has handed out in this process, in order (the repro's report).
std::vector<std::string>& variant_runs();
// `--part I/N`: N processes share one repro's training. Each walks the same runs in the same
// order; the run at position p (0-based, distinct runs) belongs to part p % N + 1. run_variant
// trains this part's runs and waits for the others' to finish, so every process ends with
// every result; inside share_training(body) it skips the others' instead, and waits for them
// after `body`, so the parts train side by side. A driver hands its runs to share_training
// first, then collects (run_variant again reuses them).
struct RunShare {
  int64_t index = 1, count = 1;
  static RunShare parse(const std::string& text);  // "I/N", 1 <= I <= N; a clear error otherwise
};
void set_run_share(RunShare share);
void share_training(const std::function<void()>& body);
// Hands out `cfg`'s run (as run_variant does) and says whether this part will train it: it is
// this part's and has not finished with that config. What a run needs before it starts (a
// surgery's initial weights) is made where this is true, so parts never write the same files.
bool trains_here(const Config& cfg);
// The recipe every arm of a fine-tuning comparison shares: `steps` steps at peak `lr` (warm-up
// a tenth of them), train.seed = 1000 + seed, one checkpoint at the end, no periodic
// evaluation, run name `name`; then validated.
void apply_finetune(Config& cfg, int64_t steps, double lr, int64_t seed, const std::string& name);
// The training mixture over the built-in corpus's domains: `domain` alone (only = true) or every
// domain but it (only = false); a clear error for a name that is not a domain.
void weight_domains(Config& cfg, const std::string& domain, bool only);
// A measurement of finished run `run_dir` under `key`: computed by `measure` once, then read from
// the run's measures.json (dropped when the run's summary.json changes). A run's record without
// its checkpoints, committed from an earlier session or machine, still serves the repro.
nlohmann::json run_measure(const std::string& run_dir, const std::string& key,
                           const std::function<nlohmann::json()>& measure);
// run_measure(first run of `cfgs`, key, measure) now, when every run of `cfgs` has finished and the
// first is this part's; else nothing. For a measurement that needs several runs' checkpoints
// (they are not committed): called inside share_training as runs finish, it is taken in the
// session that trained them.
void measure_when_finished(const std::vector<Config>& cfgs, const std::string& key,
                           const std::function<nlohmann::json()>& measure);
// What every repro command takes: --config, --out, --seeds, --quick, --set.
struct ReproArgs {
  std::string config, out;
  std::vector<std::string> sets;
  int64_t seeds = 2;
  bool quick = false;
  std::vector<std::string> lr_sweep = {};  // peak learning rates tried on the reference arm first (lr_sweep())
  std::string part = "";  // "I/N" (RunShare): not in command_line(), it splits the training, not the results
  std::string command_line(const std::string& name) const;  // "moeforge repro NAME --seeds 2 --set ..."
};
// The base config: --config, then (with --quick) the quick overrides and one seed, then --set;
// sets the run share from --part.
Config repro_base_config(ReproArgs& a, const std::vector<std::string>& quick_overrides);

}  // namespace mf
