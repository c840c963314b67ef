// Reproduction results as a pure function of the runs. A driver trains (or reuses) its runs and
// collects what it measured into results.json; a renderer registered under the driver's name
// turns that file, and nothing else, into results.md and the pictures. `moeforge repro NAME
// --report-only` renders again without training, and a test renders every committed
// docs/repro/*/results.json and compares the bytes with the committed results.md.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf {

// Writes the pictures into `out_dir` and returns results.md's text.
using ReproRender = std::function<std::string(const nlohmann::json& results, const std::string& out_dir)>;
void register_repro_render(const std::string& name, ReproRender render);

constexpr int kReproFormat = 2;  // results.json files a renderer reads (older ones predate rendering)

// A new results.json: {"repro": name, "format": kReproFormat, "command": command}.
nlohmann::json repro_results(const std::string& name, const std::string& command);
// Adds what every results file carries about the runs: "runs" (directories, in training order),
// "commits" (the distinct commits that trained them, from their summaries), "training_minutes"
// (summed, reused runs included) and "health" (training_health() of each run, by run name).
void record_runs(nlohmann::json& results, const std::vector<std::string>& run_dirs);

// results.md's text for `results` (its renderer by "repro"), pictures into `out_dir`; a clear
// error for a file without a renderer or of an older format.
std::string render_results(const nlohmann::json& results, const std::string& out_dir);
// Writes results.json, then results.md from it (and report.html from the runs when they are here).
void write_results_files(const nlohmann::json& results, const std::string& out_dir);
// --report-only: results.md and the pictures again from `out_dir`/results.json.
void rerender_results(const std::string& out_dir);

// Pieces renderers share.
// "Produced by `command`. Runs: N, trained at commit(s) `a`, `b`; M min of training summed."
std::string results_header(const nlohmann::json& results);
// The reason no verdict is called ("" when every run is well trained): the runs that fail the rule.
std::string withheld_reason(const nlohmann::json& results);
// "## The paper's directions ..." with every entry of results["directions"] (primary first, in
// their stored order) and how to read them; verdicts withheld when withheld_reason() says so,
// and checked against the 80 % values where runs were still falling fast (direction_line).
std::string directions_section(const nlohmann::json& results);
// shown_call() of direction `d` of `results` under its runs' health (as directions_section shows it).
std::string direction_call(const nlohmann::json& results, const nlohmann::json& d);
// results["directions"] from `add` (which appends direction_json entries computed from every
// arm's "val_loss"), each with its "early" value: `add` again on a copy whose arms' "val_loss" is
// their "val_loss_80" (and every "X" with an "X_80", e.g. "accuracy") and which carries
// "early_pass": true (an `add` skips there the directions not computed from the held-out
// values). Matched by text; none when an arm lacks an 80 % value.
void add_directions_with_early(nlohmann::json& results, const std::function<void(nlohmann::json&)>& add);
// The line linking report.html (every run on one page), or "" when the file names no runs.
std::string report_link(const nlohmann::json& results);
// report_link(), then "## What this miniature can and cannot show" with one "- " line per bullet,
// closed by the reminder that "not resolved" is not evidence of no effect (and `note` after it).
std::string limits_section(const nlohmann::json& results, const std::vector<std::string>& bullets,
                           const std::string& note = "");
// Where the runs end: the lowest and highest final val loss in results["health"], and the
// corpus's unigram entropy (the initial plateau) for "What this miniature can and cannot show".
struct LossSpan {
  double lo = 0, hi = 0, unigram = 0;
};
LossSpan loss_span(const nlohmann::json& results);
// The learning-rate sweep's table (results["lr_sweep"]), or "" without one.
std::string lr_sweep_section(const nlohmann::json& results);

// The sweep a driver runs before its arms: `arm` (the reference arm, seed 0) at each of `lrs` (as
// given on the command line), as run "sweep-lr<lr>", or as `arm_run` at the arm's own lr (the
// arm's seed-0 run, so it is trained once); returns [{lr, val_loss, run}] for results["lr_sweep"].
nlohmann::json lr_sweep(const Config& arm, const std::vector<std::string>& lrs, const std::string& arm_run);
// Those runs' configs (for share_training).
std::vector<Config> lr_sweep_configs(const Config& arm, const std::vector<std::string>& lrs,
                                     const std::string& arm_run);

}  // namespace mf
