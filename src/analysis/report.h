// `moeforge report`: one self-contained HTML page per run or comparison of runs (inline CSS,
// JS and SVG; nothing fetched when it is opened). Reads what a run directory holds now, so a
// run that is still training can be reported.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mf {

// What the page shows of one run directory: facts from config.toml and environment.json,
// training / validation series from metrics.jsonl (at most `max_points` per series), per MoE
// layer the routing statistics over time and the last logged loads, and the SVG pictures the
// analysis commands left in the run or its latest checkpoint. Throws naming the directory if
// it is not a run.
nlohmann::json collect_report_run(const std::string& run_dir, int64_t max_points = 1500);

// The page for these runs (several are overlaid for comparison).
std::string report_html(const std::vector<nlohmann::json>& runs, const std::string& title);

// Collects every run, writes the page atomically to `out`, returns the number of panels' runs.
void write_report(const std::vector<std::string>& run_dirs, const std::string& out, const std::string& title = "");

}  // namespace mf
