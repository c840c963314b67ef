// `moeforge repro unif` (see repro.h). A dense backbone is pretrained once (the LM without the
// target domain), blocks `layers` are upcycled per seed into every arm, and every arm and a dense
// control is fine-tuned with the same steps, recipe and batches (the LM on the target domain
// alone: a shift the routing can answer). Each run's upcycled slots are re-timed at their trained
// routing as soon as it finishes, against the backbone's. Every number goes to results.json;
// render_unif_results() (repro_render.cpp) writes results.md.
#include "methods/unif/repro.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "core/util.h"
#include "io/model_io.h"
#include "io/upcycle.h"
#include "methods/unif/diagnostics.h"
#include "methods/unif/slots.h"
#include "train/evaluable.h"
#include "train/metrics.h"
#include "train/repro_report.h"
#include "train/repro_stats.h"

namespace mf {
namespace {
namespace fs = std::filesystem;
constexpr int64_t kTimingTokens = 2048;  // per slot call when re-timing

struct UnifArm {
  std::string name, label, method;  // method: "" = the dense control
  std::vector<std::string> sets;
  bool primary = false;  // trained at every seed; the others at the first --secondary-seeds
};

std::vector<UnifArm> unif_arms(const UniFReproOptions& o) {
  return {{"dense", "dense (fine-tuned as long)", "", {}, true},
          {"top2", "top-2 MoE", "topk", {}, true},
          {"unif", "UniF-MoE", "unif", {}, true},
          {"top1", "top-1 MoE", "topk", {"model.moe.top_k=1"}},
          {"topp", fmt::format("top-p MoE (p = {})", o.top_p), "topp", {}},
          {"unif_fixed_alpha", "UniF-MoE, fixed alpha = 0.4", "unif", {"model.moe.unif.fixed_alpha=0.4"}},
          {"unif_top2", "UniF-MoE, top-2 residual experts", "unif", {"model.moe.unif.residual_top_k=2"}},
          {"unif_prefix", "UniF-MoE, prefix blocks", "unif", {"model.moe.unif.block_select=prefix"}}};
}

// The ViT's class shift: cfg keeps only `classes` (only) or every class but them.
void shift_classes(Config& cfg, const std::string& classes, bool only) {
  std::vector<int64_t> target;
  try {
    target = parse_index_list(classes, "repro unif --classes");
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  std::string rest;
  for (int64_t k = 0; k < cfg.model.num_classes; ++k)
    if (std::find(target.begin(), target.end(), k) == target.end())
      rest += (rest.empty() ? "" : ",") + std::to_string(k);
  cfg.data.classes = only ? classes : rest;
  validate(cfg);
}

// The shift the routing is there to answer: the LM's target domain, the ViT's target classes.
void shift(Config& cfg, const UniFReproOptions& opt, bool only) {
  if (cfg.model.task == "classify")
    shift_classes(cfg, opt.classes, only);
  else
    weight_domains(cfg, opt.domain, only);
}

struct Finetune {
  Config cfg;
  std::string init;
};

// UnifArm `arm`'s fine-tune at seed s: its config, and its upcycled initial weights (written by the
// part that trains it).
Finetune finetune_of(const UnifArm& arm, int64_t s, const std::string& pretrained, const UniFReproOptions& opt,
                     int64_t steps, const fs::path& work) {
  const auto name = fmt::format("unif-{}-s{}", arm.name, s);
  Finetune f{checkpoint_config(pretrained), pretrained};
  UpcycleOptions u;
  u.layers = parse_block_list(opt.layers, "repro unif --layers");
  u.method = arm.method;
  u.experts = opt.experts;
  u.blocks = opt.blocks;
  u.top_p = opt.top_p;
  u.seed = static_cast<uint64_t>(s);
  u.sets = arm.sets;
  if (!arm.method.empty()) f.cfg = upcycled_config(f.cfg, u);
  shift(f.cfg, opt, true);
  apply_finetune(f.cfg, steps, opt.finetune_lr, s, name);
  apply_override(f.cfg, fmt::format("eval.every={}", std::max<int64_t>(1, steps / 15)));
  validate(f.cfg);
  if (!arm.method.empty()) {
    f.init = (work / "unif-upcycled" / name).string();
    if (trains_here(f.cfg) && !fs::exists(f.init + "/model.safetensors")) upcycle(pretrained, f.init, u);
  }
  return f;
}

// The quality of a run in the task's own terms: the LM's target-domain loss (and the others'
// mean), the ViT's validation loss and accuracy (%); "_80": at 80 % of the steps.
void collect_unif_quality(nlohmann::json& arm, const std::string& dir, const Config& cfg, const std::string& domain) {
  const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
  const bool vision = cfg.model.task == "classify";
  auto loss_of = [&](const nlohmann::json& rec) -> nlohmann::json {
    if (vision) return rec["val_loss_mean"];
    return rec["val_loss"].contains(domain) ? rec["val_loss"][domain] : nlohmann::json();
  };
  nlohmann::json at80;
  for (const auto& r : read_metrics(dir + "/metrics.jsonl"))
    if (r.contains("val_loss_mean") && r["step"].get<double>() <= 0.8 * static_cast<double>(cfg.train.steps) + 1e-9)
      at80 = r;
  arm["val_loss"].push_back(loss_of(summary));
  arm["val_loss_80"].push_back(at80.is_null() ? nlohmann::json() : loss_of(at80));
  if (vision) {
    arm["accuracy"].push_back(100 * summary["val_accuracy"].get<double>());
    arm["accuracy_80"].push_back(at80.is_null() ? nlohmann::json()
                                                : nlohmann::json(100 * at80["val_accuracy"].get<double>()));
  } else {
    double others = 0, n = 0;
    for (const auto& [d, v] : summary["val_loss"].items())
      if (d != domain) others += v.get<double>(), ++n;
    arm["others"].push_back(n > 0 ? others / n : 0.0);
  }
  arm["params"].push_back(summary["parameters"]);
}

// A finished run's upcycled slots: their routing on held-out data, and their seconds per round
// run in turns with the pretrained backbone's dense slots on the same windows. Each run is
// timed by the part that trained it as soon as it finishes (its checkpoint is not committed);
// the backbone (committed) is the common yardstick, so two runs compare as the ratio of their
// same-round ratios to it.
nlohmann::json time_run(const std::string& dir, const std::string& backbone, const UniFReproOptions& opt, bool quick) {
  const auto layers = parse_block_list(opt.layers, "repro unif --layers");
  const int64_t windows = quick ? 2 : 16;
  std::map<std::string, CapturedSlots> c = {
      {"run", capture_slots(dir, layers, opt.blocks, opt.domain, windows, kTimingTokens)},
      {"backbone", capture_slots(backbone, layers, opt.blocks, opt.domain, windows, kTimingTokens)}};
  const auto rounds = time_in_rounds(c, quick ? 2 : static_cast<int>(opt.timing_rounds));
  const auto& run = c.at("run");
  return {{"rounds", rounds.at("run")},
          {"backbone_rounds", rounds.at("backbone")},
          {"tokens", run.inputs_TD.empty() ? 0 : run.inputs_TD[0].size(0)},
          {"blocks", run.blocks},
          {"k", run.k},
          {"b", run.b}};
}

// The paper's motivation measured on a fine-tuned top-2 arm (`moeforge diagnose`), per block.
nlohmann::json motivation(const std::string& dir, bool quick) {
  DiagnoseOptions d;
  d.split = "test";
  d.tokens = quick ? 200 : 4096;
  d.fit_steps = quick ? 5 : 300;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& l : diagnose_motivation(open_evaluable(dir, quick ? 4 : 64), d))
    out.push_back({{"layer", l.layer},
                   {"pearson", l.pearson},  // null when rho or co-activation is the same for every pair
                   {"rho_min", l.rho.empty() ? NAN : *std::min_element(l.rho.begin(), l.rho.end())},
                   {"rho_max", l.rho.empty() ? NAN : *std::max_element(l.rho.begin(), l.rho.end())},
                   {"mean_k", l.mean_k},
                   {"kept_top2", l.kept_top2},
                   {"rho_vs_pair_k", l.rho_vs_pair_k}});
  return out;
}

// The directions, chosen before running. Primary: UniF-MoE's quality at least top-2's, and its
// upcycled slots faster than top-2's at the trained routing (the paper's headline pair).
void add_unif_directions(nlohmann::json& r) {
  const bool vision = r["setup"]["task"] == "classify";
  const auto& a = r["arms"];
  auto& dirs = r["directions"];
  // "x is better than y": higher accuracy, or lower target-domain loss (y's minus x's)
  const std::string metric =
      vision ? "validation accuracy" : r["setup"]["domain"].get<std::string>() + " validation loss";
  auto better = [&](const std::string& text, const std::string& x, const std::string& y, bool primary) {
    const auto d = vision ? paired_difference(seed_values(a[x], "accuracy"), seed_values(a[y], "accuracy"))
                          : paired_difference(seed_values(a[y], "val_loss"), seed_values(a[x], "val_loss"));
    const auto how = vision ? fmt::format("{}, {} - {}", metric, x, y) : fmt::format("{}, {} - {}", metric, y, x);
    dirs.push_back(direction_json(
        {text + " (" + how + ")", true, primary, std::nullopt, vision ? " points" : " nats", 1, vision ? 2 : 4}, d));
  };
  auto ratio_minus_one = [&](const std::string& x, const std::string& key) {
    std::vector<double> out;
    const auto v = seed_values(a[x], key);
    for (double e : v) out.push_back(e - 1);
    return paired_difference(out, std::vector<double>(out.size(), 0.0));
  };
  auto more_blocks = [&](const std::string& x, const std::string& y) {
    return paired_difference(seed_values(a[x], "blocks"), seed_values(a[y], "blocks"));
  };
  const bool early = r.value("early_pass", false);  // the held-out quality at 80 % of the steps only
  better("UniF-MoE is at least as good as top-2", "unif", "top2", true);
  if (!early)
    dirs.push_back(direction_json(
        {"UniF-MoE's upcycled slots run faster than top-2's (time ratio UniF-MoE / top-2 "
         "at the trained routing, each against the backbone in interleaved rounds, minus 1)",
         false, true, PaperEffect{-45.2, "Table III, VLCS: inference time per step vs top-2 GMoE"}, " %", 100, 1},
        ratio_minus_one("unif", "time_ratio")));
  if (!early)
    dirs.push_back(
        direction_json({"UniF-MoE activates fewer blocks than top-2 (C_B ratio UniF-MoE / top-2, minus 1)", false,
                        false, PaperEffect{-16.1, "Table III, VLCS: FLOPs vs top-2 GMoE"}, " %", 100, 1},
                       ratio_minus_one("unif", "blocks_ratio")));
  better("UniF-MoE is better than the dense control", "unif", "dense", false);
  better("UniF-MoE is better than top-1 (the pair at comparable blocks)", "unif", "top1", false);
  better("top-2 is better than top-1 (more routed compute pays here)", "top2", "top1", false);
  for (const std::string x : {"unif_fixed_alpha", "unif_top2", "unif_prefix"}) {
    const auto label = a[x]["label"].get<std::string>();
    better(label + " is worse than UniF-MoE", "unif", x, false);
    if (!early)
      dirs.push_back(direction_json(
          {label + " activates more blocks than UniF-MoE (C_B difference)", true, false, std::nullopt, " blocks", 1, 2},
          more_blocks(x, "unif")));
  }
}

}  // namespace

nlohmann::json unif_repro(ReproArgs args, const UniFReproOptions& opt) {
  const bool vision = load_config(args.config).model.task == "classify";
  std::vector<std::string> quick = {"model.d_model=16",     "model.n_layers=4",    "model.n_heads=2",
                                    "model.n_kv_heads=2",   "model.ffn_hidden=32", "train.steps=10",
                                    "train.warmup_steps=2", "eval.every=5"};
  for (auto set : vision ? std::vector<std::string>{"train.batch_size=16", "data.val_images=500"}
                         : std::vector<std::string>{"train.batch_size=4", "train.seq_len=32", "eval.windows=2"})
    quick.push_back(set);
  auto base = repro_base_config(args, quick);
  if (vision ? base.model.ffn != "gelu" : base.model.ffn != "swiglu" && base.model.ffn != "gelu")
    throw ConfigError(
        "repro unif: the base config must be a dense model to upcycle: a ViT with model.ffn = \"gelu\" or an LM "
        "with model.ffn = \"swiglu\" or \"gelu\"");
  const int64_t steps = args.quick ? 10 : opt.finetune_steps;
  const int64_t secondary = std::min(args.seeds, opt.secondary_seeds);
  auto js = repro_results(
      "unif", args.command_line("unif") +
                  fmt::format(" --layers {} --experts {} --blocks {} --top-p {:g} --domain {} --finetune-steps {} "
                              "--finetune-lr {:g} --secondary-seeds {} --timing-rounds {}",
                              opt.layers, opt.experts, opt.blocks, opt.top_p, opt.domain, opt.finetune_steps,
                              opt.finetune_lr, opt.secondary_seeds, opt.timing_rounds) +
                  (vision ? " --classes " + opt.classes : ""));
  shift(base, opt, false);
  base.run.name = "unif-dense-pretrain";
  const auto& m = base.model;
  js["setup"] = {{"task", vision ? "classify" : "lm"},
                 {"domain", vision ? "" : opt.domain},
                 {"d_model", m.d_model},
                 {"n_layers", m.n_layers},
                 {"ffn", m.ffn},
                 {"ffn_hidden", m.ffn_hidden},
                 {"layers", opt.layers},
                 {"experts", opt.experts},
                 {"blocks", opt.blocks},
                 {"top_p", opt.top_p},
                 {"pretrain_steps", base.train.steps},
                 {"pretrain_lr", base.train.lr},
                 {"finetune_steps", steps},
                 {"finetune_lr", opt.finetune_lr},
                 {"items_per_step", vision ? base.train.batch_size : base.train.batch_size * base.train.seq_len},
                 {"seeds", args.seeds},
                 {"secondary_seeds", secondary},
                 {"timing_rounds", args.quick ? 2 : opt.timing_rounds},
                 {"timing_tokens", kTimingTokens},
                 {"windows", base.eval.windows},
                 {"threads", base.train.threads}};
  if (vision) js["setup"]["classes"] = opt.classes;
  spdlog::info("repro unif: pretraining the dense backbone ({} steps)", base.train.steps);
  share_training([&] { run_variant(base); });
  const auto pretrained = run_variant(base);
  const auto work = fs::path(base.run.out_dir);
  const auto all = unif_arms(opt);
  // seed s's fine-tunes, top-2 first
  auto seed_runs = [&](int64_t s) {
    std::vector<std::pair<UnifArm, Finetune>> out;
    for (const auto& arm : all)
      if (s < (arm.primary ? args.seeds : secondary))
        out.emplace_back(arm, finetune_of(arm, s, pretrained, opt, steps, work));
    std::stable_partition(out.begin(), out.end(), [](const auto& r) { return r.first.name == "top2"; });
    return out;
  };
  const auto time_of = [&](const Config& cfg) {
    const auto dir = (work / cfg.run.name).string();
    return [&, dir] { return time_run(dir, pretrained, opt, args.quick); };
  };
  share_training([&] {
    for (int64_t s = 0; s < args.seeds; ++s)
      for (const auto& [arm, f] : seed_runs(s)) {
        spdlog::info("repro unif: {} seed {}", arm.label, s);
        run_variant(f.cfg, f.init);
        measure_when_finished({f.cfg}, "timing", time_of(f.cfg));  // this part's runs, while their checkpoints are here
        if (s == 0 && arm.name == "top2")
          measure_when_finished({f.cfg}, "motivation",
                                [&] { return motivation((work / f.cfg.run.name).string(), args.quick); });
      }
  });
  std::vector<std::string> runs = {pretrained};
  for (int64_t s = 0; s < args.seeds; ++s) {
    std::map<std::string, nlohmann::json> t;  // by arm
    for (const auto& [arm, f] : seed_runs(s)) {
      runs.push_back(run_variant(f.cfg, f.init));
      js["arms"][arm.name]["label"] = arm.label;
      collect_unif_quality(js["arms"][arm.name], runs.back(), f.cfg, opt.domain);
      t[arm.name] = run_measure(runs.back(), "timing", time_of(f.cfg));
    }
    // each arm's time against the backbone's in the same rounds; against top-2 as the ratio of those
    auto to_backbone = [&](const std::string& arm) {
      return median_ratio(t[arm]["rounds"].get<std::vector<double>>(),
                          t[arm]["backbone_rounds"].get<std::vector<double>>());
    };
    for (const auto& [name, mine] : t) {
      auto& arm = js["arms"][name];
      const auto rounds = mine["rounds"].get<std::vector<double>>();
      for (const char* key : {"blocks", "k", "b"}) arm[key].push_back(mine[key]);
      arm["us_per_token"].push_back(1e6 * median(rounds) / mine["tokens"].get<double>());
      arm["time_vs_backbone"].push_back(to_backbone(name));
      arm["time_ratio"].push_back(to_backbone(name) / to_backbone("top2"));
      arm["blocks_ratio"].push_back(mine["blocks"].get<double>() / t["top2"]["blocks"].get<double>());
    }
  }
  const auto top2 = (work / seed_runs(0).front().second.cfg.run.name).string();  // top-2 comes first
  js["motivation"] = run_measure(top2, "motivation", [&] { return motivation(top2, args.quick); });
  record_runs(js, runs);
  add_directions_with_early(js, add_unif_directions);
  return js;
}

}  // namespace mf
