#include "train/repro_runs.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "core/util.h"
#include "io/checkpoint.h"
#include "train/trainer.h"

namespace mf {

double Outcome::std() const {
  if (loss.size() < 2) return 0;
  double m = mean(), s = 0;
  for (double l : loss) s += (l - m) * (l - m);
  return std::sqrt(s / static_cast<double>(loss.size() - 1));
}

std::string ReproArgs::command_line(const std::string& name) const {
  std::string s = fmt::format("moeforge repro {} --seeds {}", name, seeds);
  if (quick) s += " --quick";
  if (!config.empty()) s += " --config " + config;
  for (auto& set : sets) s += " --set " + set;
  if (!out.empty()) s += " --out " + out;
  for (size_t i = 0; i < lr_sweep.size(); ++i) s += (i ? "," : " --lr-sweep ") + lr_sweep[i];
  return s;
}

namespace {
RunShare& run_share() {
  static RunShare share;
  return share;
}
// Inside share_training: the other parts' runs handed out, with their configs, to wait for after.
std::vector<Config>* skipped = nullptr;

// Whether this process trains `dir` (handed out by run_variant) under the run share.
bool own_run(const std::string& dir) {
  const auto& runs = variant_runs();
  const auto it = std::find(runs.begin(), runs.end(), dir);
  return it == runs.end() || (it - runs.begin()) % run_share().count == run_share().index - 1;
}
}  // namespace

Config repro_base_config(ReproArgs& a, const std::vector<std::string>& quick_overrides) {
  Config base = load_config(a.config);
  if (a.quick) {
    for (auto& s : quick_overrides) apply_override(base, s);
    a.seeds = 1;
  }
  for (auto& s : a.sets) apply_override(base, s);
  validate(base);
  set_run_share(a.part.empty() ? RunShare{} : RunShare::parse(a.part));
  std::filesystem::create_directories(a.out);
  return base;
}

void apply_finetune(Config& cfg, int64_t steps, double lr, int64_t seed, const std::string& name) {
  for (auto set : {fmt::format("train.steps={}", steps), fmt::format("train.lr={}", lr),
                   fmt::format("train.warmup_steps={}", std::max<int64_t>(1, steps / 10)),
                   fmt::format("train.seed={}", 1000 + seed), fmt::format("train.ckpt_every={}", steps),
                   std::string("eval.every=0"), "run.name=" + name})
    apply_override(cfg, set);
  validate(cfg);
}

void weight_domains(Config& cfg, const std::string& domain, bool only) {
  const std::vector<std::pair<std::string, double*>> weights = {{"dictionary", &cfg.data.weight_dictionary},
                                                                {"scripture", &cfg.data.weight_scripture},
                                                                {"technical", &cfg.data.weight_technical},
                                                                {"quotations", &cfg.data.weight_quotations}};
  if (std::none_of(weights.begin(), weights.end(), [&](const auto& w) { return w.first == domain; }))
    throw std::invalid_argument(fmt::format(
        "'{}' is not a domain of the built-in corpus (dictionary, scripture, technical, quotations)", domain));
  for (auto& [name, w] : weights) *w = (name == domain) == only ? 1.0 : 0.0;
}

nlohmann::json run_measure(const std::string& run_dir, const std::string& key,
                           const std::function<nlohmann::json()>& measure) {
  const auto path = run_dir + "/measures.json";
  const auto summary = nlohmann::json::parse(read_file(run_dir + "/summary.json"));
  auto kept_now = [&] {
    auto kept = std::filesystem::exists(path) ? nlohmann::json::parse(read_file(path)) : nlohmann::json::object();
    return kept.value("summary", nlohmann::json()) == summary ? kept : nlohmann::json{{"summary", summary}};
  };
  auto kept = kept_now();
  if (!kept.contains(key) && !own_run(run_dir)) {  // measured by the part that trained it
    spdlog::info("{}: waiting for another part's {}", run_dir, key);
    while (!(kept = kept_now()).contains(key)) std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  if (!kept.contains(key)) {
    kept[key] = measure();
    write_file_atomic(path, kept.dump(1) + "\n");
  }
  return kept[key];
}

namespace {

// The run's stored config, resolved as today's code reads it: keys added since take their
// defaults, so a new method's keys do not make every earlier run look different.
bool same_resolved_config(const std::string& path, const Config& cfg) {
  if (!std::filesystem::exists(path)) return false;
  try {
    Config stored;
    apply_toml_text(stored, read_file(path), path);
    stored.model.vocab_size = cfg.model.vocab_size;  // not a config key
    return to_toml(stored) == to_toml(cfg);
  } catch (const std::exception&) {
    return false;
  }
}

bool finished_with(const std::filesystem::path& dir, const Config& cfg) {
  if (!same_resolved_config((dir / "config.toml").string(), cfg) || !std::filesystem::exists(dir / "summary.json"))
    return false;
  try {
    return nlohmann::json::parse(read_file((dir / "summary.json").string())).value("finished", false);
  } catch (const std::exception&) {  // being written by the process that trains it
    return false;
  }
}

}  // namespace

std::vector<std::string>& variant_runs() {
  static std::vector<std::string> runs;
  return runs;
}

RunShare RunShare::parse(const std::string& text) {
  RunShare s;
  char slash = 0;
  std::istringstream in(text);
  if (!(in >> s.index >> slash >> s.count) || slash != '/' || !in.eof() || s.count < 1 || s.index < 1 ||
      s.index > s.count)
    throw std::runtime_error("--part \"" + text + "\": expected I/N with 1 <= I <= N, e.g. 1/2");
  return s;
}

void set_run_share(RunShare share) { run_share() = share; }

void share_training(const std::function<void()>& body) {
  std::vector<Config> others;
  skipped = &others;
  try {
    body();
  } catch (...) {
    skipped = nullptr;
    throw;
  }
  skipped = nullptr;
  for (const auto& cfg : others) run_variant(cfg);  // waits for each
}

namespace {
std::filesystem::path hand_out(const Config& cfg) {
  const auto dir = std::filesystem::path(cfg.run.out_dir) / cfg.run.name;
  auto& runs = variant_runs();
  if (std::find(runs.begin(), runs.end(), dir.string()) == runs.end()) runs.push_back(dir.string());
  return dir;
}
}  // namespace

bool trains_here(const Config& cfg) {
  const auto dir = hand_out(cfg);
  return own_run(dir.string()) && !finished_with(dir, cfg);
}

void measure_when_finished(const std::vector<Config>& cfgs, const std::string& key,
                           const std::function<nlohmann::json()>& measure) {
  if (cfgs.empty() || !own_run(hand_out(cfgs.front()).string())) return;
  for (const auto& cfg : cfgs)
    if (!finished_with(hand_out(cfg), cfg)) return;
  run_measure(hand_out(cfgs.front()).string(), key, measure);
}

std::string run_variant(const Config& cfg, const std::string& init_from) {
  const auto dir = hand_out(cfg);
  if (!own_run(dir.string())) {
    if (skipped) {
      const auto seen = std::find_if(skipped->begin(), skipped->end(), [&](const Config& c) {
        return c.run.name == cfg.run.name && c.run.out_dir == cfg.run.out_dir;
      });
      if (seen == skipped->end()) skipped->push_back(cfg);
      return dir.string();
    }
    if (!finished_with(dir, cfg))
      spdlog::info("{}: trained by another part of this repro, waiting for it", cfg.run.name);
    while (!finished_with(dir, cfg)) std::this_thread::sleep_for(std::chrono::seconds(2));
    return dir.string();
  }
  if (finished_with(dir, cfg)) {
    spdlog::info("{}: finished earlier, reusing", cfg.run.name);
    return dir.string();
  }
  const bool same_config = same_resolved_config((dir / "config.toml").string(), cfg);
  TrainOptions opt;
  opt.init_from = init_from;
  if (same_config && !latest_checkpoint(dir.string()).empty())
    opt.resume = dir.string();
  else
    opt.overwrite = true;
  return train(cfg, opt).run_dir;
}

}  // namespace mf
