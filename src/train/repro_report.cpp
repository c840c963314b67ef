#include "train/repro_report.h"

#include <fmt/format.h>

#include <algorithm>

#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "analysis/report.h"
#include "core/util.h"
#include "train/repro_runs.h"
#include "train/repro_stats.h"

namespace mf {
namespace {
namespace fs = std::filesystem;

std::map<std::string, ReproRender>& renders() {
  static std::map<std::string, ReproRender> r;
  return r;
}

}  // namespace

void register_repro_render(const std::string& name, ReproRender render) { renders()[name] = std::move(render); }

nlohmann::json repro_results(const std::string& name, const std::string& command) {
  return {{"repro", name}, {"format", kReproFormat}, {"command", command}};
}

void record_runs(nlohmann::json& results, const std::vector<std::string>& run_dirs) {
  std::set<std::string> commits;
  double seconds = 0;
  results["runs"] = run_dirs;
  for (const auto& dir : run_dirs) {
    const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
    commits.insert(summary.value("commit", std::string("unrecorded")));
    seconds += summary.value("elapsed_s", 0.0);
    const auto h = training_health(dir);
    results["health"][fs::path(dir).filename().string()] = {{"val_loss", h.val_loss},
                                                            {"unigram", h.unigram},
                                                            {"late_fall", h.late_fall},
                                                            {"problem", h.problem},
                                                            {"kind", h.kind}};
  }
  results["commits"] = std::vector<std::string>(commits.begin(), commits.end());
  results["training_minutes"] = seconds / 60;
}

std::string render_results(const nlohmann::json& results, const std::string& out_dir) {
  if (results.value("format", 0) != kReproFormat)
    throw std::runtime_error(fmt::format(
        "{}/results.json is of format {} (this build renders format {}): it predates rendering from results.json; "
        "rerun the reproduction to regenerate it",
        out_dir, results.value("format", 0), kReproFormat));
  const auto name = results.value("repro", std::string());
  const auto it = renders().find(name);
  if (it == renders().end())
    throw std::runtime_error(fmt::format("{}/results.json: no renderer for repro \"{}\"", out_dir, name));
  return it->second(results, out_dir);
}

void write_results_files(const nlohmann::json& results, const std::string& out_dir) {
  fs::create_directories(out_dir);
  write_file_atomic((fs::path(out_dir) / "results.json").string(), results.dump(1) + "\n");
  std::vector<std::string> runs;
  for (const auto& r : results.value("runs", nlohmann::json::array()))
    if (fs::exists(r.get<std::string>() + "/summary.json")) runs.push_back(r.get<std::string>());
  if (!runs.empty())
    write_report(runs, (fs::path(out_dir) / "report.html").string(),
                 "moeforge report: " + fs::path(out_dir).filename().string() + " reproduction");
  write_file_atomic((fs::path(out_dir) / "results.md").string(), render_results(results, out_dir));
}

void rerender_results(const std::string& out_dir) {
  const auto path = (fs::path(out_dir) / "results.json").string();
  if (!fs::exists(path)) throw std::runtime_error(path + " does not exist: --report-only renders an earlier run's");
  const auto results = nlohmann::json::parse(read_file(path));
  write_file_atomic((fs::path(out_dir) / "results.md").string(), render_results(results, out_dir));
}

std::string results_header(const nlohmann::json& results) {
  std::string commits;
  for (const auto& c : results.value("commits", nlohmann::json::array()))
    commits += fmt::format("{}`{}`", commits.empty() ? "" : ", ", c.get<std::string>());
  const auto n = results.value("runs", nlohmann::json::array()).size();
  return fmt::format(
      "Produced by `{}`, rendered from its results.json (`--report-only` renders it again). {} runs, trained at "
      "commit{} {}; {:.1f} min of "
      "training summed over them.",
      results["command"].get<std::string>(), n,
      results.value("commits", nlohmann::json::array()).size() == 1 ? "" : "s",
      commits.empty() ? "(none recorded)" : commits, results.value("training_minutes", 0.0));
}

namespace {

// The problems of the runs whose health `blocking` selects, as one sentence ("" when none).
std::string problems(const nlohmann::json& results, bool blocking) {
  std::vector<std::string> bad;
  const auto health = results.value("health", nlohmann::json::object());
  for (const auto& [run, h] : health.items()) {
    const auto problem = h.value("problem", std::string());
    // a file without "kind" predates the 80 % check: every problem blocks there
    if (!problem.empty() && (h.value("kind", std::string()) != "falling") == blocking) bad.push_back(problem);
  }
  if (bad.empty()) return "";
  std::string s = fmt::format("{} of {} runs {}: {}", bad.size(), health.size(),
                              blocking ? "are not well trained" : "were still falling fast at the end", bad[0]);
  if (bad.size() > 1) s += fmt::format(" (and {} more, listed in results.json's \"health\")", bad.size() - 1);
  return s;
}

}  // namespace

std::string withheld_reason(const nlohmann::json& results) { return problems(results, true); }

std::string directions_section(const nlohmann::json& results) {
  const auto withheld = withheld_reason(results), falling = problems(results, false);
  std::string md =
      "## The paper's directions at this scale\n\nEach direction is the mean of the per-seed paired differences with "
      "its two-sided 95 % Student-t interval (n - 1 degrees of freedom): **held** when the interval excludes 0 on the "
      "paper's side, **did not hold** when it excludes 0 on the other, otherwise **not resolved at this scale**. "
      "\"Detectable at this n\" is the interval's half-width: the smallest difference this many seeds with this "
      "spread could have resolved. Primary directions were chosen before running; the rest are secondary.\n\n";
  if (!withheld.empty())
    md += fmt::format(
        "**No verdicts are called**: {}. A verdict needs every run at least 0.5 nats below the unigram entropy, "
        "with at least 3 losses logged in its last 20 % of steps.\n\n",
        withheld);
  else if (!falling.empty())
    md += fmt::format(
        "**Verdicts need the same call at 80 % of the steps**: {} (the slope of the held-out losses there). A "
        "ranking that formed while runs were still falling may be one of optimisation speed, so a held or "
        "did-not-hold verdict stands only where the held-out losses at 80 % of the steps give the same verdict; "
        "otherwise no verdict is called.\n\n",
        falling);
  const auto dirs = results.value("directions", nlohmann::json::array());
  for (bool primary : {true, false})
    for (const auto& d : dirs)
      if (d.value("primary", false) == primary)
        md += direction_line(d, withheld.empty() ? "" : "runs not well trained", !falling.empty());
  return md;
}

std::string direction_call(const nlohmann::json& results, const nlohmann::json& d) {
  return shown_call(d, !withheld_reason(results).empty(), !problems(results, false).empty());
}

void add_directions_with_early(nlohmann::json& results, const std::function<void(nlohmann::json&)>& add) {
  results["directions"] = nlohmann::json::array();
  add(results);
  auto early = results;
  early["early_pass"] = true;
  early["directions"] = nlohmann::json::array();
  auto whole = [](const nlohmann::json& v) {
    return v.is_array() && std::none_of(v.begin(), v.end(), [](const auto& x) { return x.is_null(); });
  };
  for (auto& [name, arm] : early["arms"].items()) {
    if (!whole(arm.value("val_loss_80", nlohmann::json()))) return;  // a run without an evaluation by 80 %: none
    for (const auto& [key, v] : results["arms"][name].items())       // "val_loss_80" -> "val_loss", "accuracy_80" ...
      if (key.size() > 3 && key.compare(key.size() - 3, 3, "_80") == 0) {
        if (!whole(v)) return;
        arm[key.substr(0, key.size() - 3)] = v;
      }
  }
  add(early);
  for (auto& d : results["directions"])
    for (const auto& e : early["directions"])
      if (e["text"] == d["text"]) {
        d["early"] = nlohmann::json::object();
        for (const char* key : {"difference", "se", "seeds", "dof"})
          if (e.contains(key)) d["early"][key] = e[key];
      }
}

std::string report_link(const nlohmann::json& results) {
  const auto runs = results.value("runs", nlohmann::json::array());
  if (runs.empty()) return "";
  return fmt::format(
      "\nEvery run of this reproduction (curves, routing, usage): [report.html](report.html) "
      "(`moeforge report {} ...`).\n",
      runs.front().get<std::string>());
}

std::string limits_section(const nlohmann::json& results, const std::vector<std::string>& bullets,
                           const std::string& note) {
  std::string md = report_link(results) + "\n## What this miniature can and cannot show\n\n";
  for (const auto& b : bullets) md += "- " + b + "\n";
  return md +
         "- A direction that is \"not resolved\" is not evidence of no effect: compare its detectable size with the "
         "paper's number." +
         (note.empty() ? "" : " " + note) + "\n";
}

LossSpan loss_span(const nlohmann::json& results) {
  LossSpan s{1e300, -1e300, 0};
  const auto health = results.value("health", nlohmann::json::object());
  for (const auto& [run, h] : health.items()) {
    s.lo = std::min(s.lo, h["val_loss"].get<double>());
    s.hi = std::max(s.hi, h["val_loss"].get<double>());
    s.unigram = h["unigram"].get<double>();
  }
  if (s.lo > s.hi) s.lo = s.hi = 0;
  return s;
}

std::string lr_sweep_section(const nlohmann::json& results) {
  if (!results.contains("lr_sweep")) return "";
  std::string md =
      "## Learning-rate sweep (the reference arm, seed 0, before the arms)\n\n| peak lr | val loss |\n|---|---|\n";
  std::map<double, double> by_lr;  // in increasing lr, whatever order the command gave
  for (const auto& r : results["lr_sweep"]) by_lr[r["lr"].get<double>()] = r["val_loss"].get<double>();
  for (const auto& [lr, loss] : by_lr) md += fmt::format("| {:g} | {:.4f} |\n", lr, loss);
  return md + "\n";
}

std::vector<Config> lr_sweep_configs(const Config& arm, const std::vector<std::string>& lrs,
                                     const std::string& arm_run) {
  std::vector<Config> out;
  for (const auto& text : lrs) {
    Config cfg = arm;
    apply_override(cfg, "train.lr=" + text);
    cfg.train.seed = 1000;
    cfg.run.name = cfg.train.lr == arm.train.lr ? arm_run : fmt::format("sweep-lr{:g}", cfg.train.lr);
    validate(cfg);
    out.push_back(cfg);
  }
  return out;
}

nlohmann::json lr_sweep(const Config& arm, const std::vector<std::string>& lrs, const std::string& arm_run) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& cfg : lr_sweep_configs(arm, lrs, arm_run)) {
    const auto dir = run_variant(cfg);
    const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
    rows.push_back({{"lr", cfg.train.lr}, {"val_loss", summary["val_loss_mean"].get<double>()}, {"run", dir}});
  }
  return rows;
}

}  // namespace mf
