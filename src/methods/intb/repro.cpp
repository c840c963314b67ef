// `moeforge repro intb` (see repro.h). Every arm trains with the same batches per seed
// (train.seed = 1000 + s), recipe and steps; the first --probe-seeds IntBMoE runs are probed
// (basis removal, recipe similarity) as soon as they finish, while their checkpoints are here.
// Every number goes to results.json; render_intb_results() (repro_render.cpp) writes results.md.
#include "methods/intb/repro.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "core/util.h"
#include "data/images.h"
#include "data/shards.h"
#include "methods/intb/bench.h"
#include "methods/intb/intb.h"
#include "methods/intb/probe.h"
#include "methods/intb/smear.h"
#include "model/params.h"
#include "model/transformer.h"
#include "model/vit.h"
#include "train/evaluable.h"
#include "train/metrics.h"
#include "train/repro_report.h"

namespace mf {
namespace {

// The primary arms: trained at every seed; the rest at the first --secondary-seeds.
bool primary(const std::string& arm) { return arm == "intb" || arm == "top2"; }

}  // namespace

std::vector<IntBArm> intb_arms(const Config& base, bool ablations) {
  const bool vision = base.model.task == "classify";
  const auto ffn = vision ? std::string("gelu") : std::string("swiglu");
  const int64_t E1 = base.model.moe.section<IntBConfig>().basis + 1, F = base.model.ffn_hidden;
  const std::vector<std::string> expert = {fmt::format("model.moe.num_experts={}", E1),
                                           fmt::format("model.moe.expert_hidden={}", F), "model.moe.activation=" + ffn,
                                           fmt::format("model.moe.expert_bias={}", vision)};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto backbone = vision ? "dense GELU backbone" : "dense SwiGLU backbone";
  std::vector<IntBArm> a = {
      {"intb", "IntBMoE", {}, "", 1, 1, "paper"},
      {"dense", backbone, {"model.ffn=" + ffn}, "", 1, 1, "paper"},
      {"top2", fmt::format("top-2 MoE ({} FFN-sized experts)", E1),
       with({"model.ffn=moe", "model.moe.top_k=2"}, expert), "", 1, 1, "paper"},
      {"smear", fmt::format("SMEAR ({} FFN-sized experts, {} level)", E1, vision ? "example" : "token"),
       with({"model.ffn=smear"}, expert), "", 1, 1, "paper"},
      {"dense_wide", fmt::format("{}, widened", backbone), {"model.ffn=" + ffn}, "model.ffn_hidden", 8, 65536, "total"},
      {"top2_total",
       "top-2 MoE (8 experts, width solved)",
       {"model.ffn=moe", "model.moe.num_experts=8", "model.moe.top_k=2"},
       "model.moe.expert_hidden",
       8,
       65536,
       "total"},
      {"smear_total",
       "SMEAR (8 experts, width solved)",
       {"model.ffn=smear", "model.moe.num_experts=8"},
       "model.moe.expert_hidden",
       8,
       65536,
       "total"}};
  if (!ablations) return a;
  const std::vector<IntBArm> more = {
      {"no_gate", "IntBMoE w/o gate path", {"model.moe.intb.gate_path=false"}, "", 1, 1, "ablation"},
      {"one_layer",
       "IntBMoE, L = 1 (pool enlarged)",
       {"model.moe.intb.internal_layers=1"},
       "model.moe.intb.basis",
       1,
       4096,
       "ablation"},
      {"fixed_lambda", "IntBMoE, fixed lambda = 1", {"model.moe.intb.learn_lambda=false"}, "", 1, 1, "ablation"},
      {"no_shared", "IntBMoE w/o shared expert", {"model.moe.intb.shared_expert=false"}, "", 1, 1, "ablation"},
      {"no_filter", "IntBMoE w/o filter", {"model.moe.intb.filter=false"}, "", 1, 1, "ablation"},
      {"softmax", "IntBMoE, softmax coefficients", {"model.moe.intb.coefficients=softmax"}, "", 1, 1, "ablation"}};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

namespace {

struct Built {
  std::shared_ptr<torch::nn::Module> root;
  std::vector<std::shared_ptr<FeedForward>> ffns;
};
Built build(const Config& cfg) {
  if (cfg.model.task == "classify") {
    auto m = VisionTransformer(cfg.model);
    return {m.ptr(), m->feed_forwards()};
  }
  auto m = TransformerLM(cfg.model);
  return {m.ptr(), m->feed_forwards()};
}

int64_t count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

int64_t total_parameters(const Config& cfg) { return count(*build(cfg).root); }

int64_t executed_parameters(const Config& cfg) {
  const auto b = build(cfg);
  int64_t n = count_parameters(*b.root, b.ffns, 0).active;
  for (const auto& f : b.ffns)
    if (const auto* s = dynamic_cast<const IntBFeedForward*>(f.get()))
      n += intb_cost(*s).executed_parameters - count(*s);
    else if (const auto* m = dynamic_cast<const SmearFeedForward*>(f.get()))
      n -= count(*m->experts) - count(*m->experts) / m->experts->num_units();
  return n;
}

int64_t match_parameters(Config cfg, const std::string& key, int64_t target, int64_t lo, int64_t hi,
                         const ParameterCount& counter) {
  auto at = [&](int64_t v) {
    apply_override(cfg, fmt::format("{}={}", key, v));
    validate(cfg);
    return counter(cfg);
  };
  while (lo < hi) {  // the smallest value whose count reaches the target
    const int64_t mid = lo + (hi - lo) / 2;
    if (at(mid) < target)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo > 1 && std::abs(at(lo - 1) - target) < std::abs(at(lo) - target)) --lo;
  return lo;
}

Config arm_config(const Config& base, const IntBArm& arm, int64_t target, const ParameterCount& counter) {
  Config c = base;
  for (auto& s : arm.sets) apply_override(c, s);
  if (!arm.match_key.empty())
    apply_override(
        c, fmt::format("{}={}", arm.match_key, match_parameters(c, arm.match_key, target, arm.lo, arm.hi, counter)));
  validate(c);
  return c;
}

namespace {

// A finished run's quality: validation loss (LM: mean over the domains) and, for the ViT,
// accuracy in points; "_80": at 80 % of the steps.
void collect_intb_quality(nlohmann::json& arm, const std::string& dir, const Config& cfg) {
  const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
  nlohmann::json at80;
  for (const auto& r : read_metrics(dir + "/metrics.jsonl"))
    if (r.contains("val_loss_mean") && r["step"].get<double>() <= 0.8 * static_cast<double>(cfg.train.steps) + 1e-9)
      at80 = r;
  arm["val_loss"].push_back(summary["val_loss_mean"]);
  arm["val_loss_80"].push_back(at80.is_null() ? nlohmann::json() : at80["val_loss_mean"]);
  if (cfg.model.task == "classify") {
    arm["accuracy"].push_back(100 * summary["val_accuracy"].get<double>());
    arm["accuracy_80"].push_back(at80.is_null() ? nlohmann::json()
                                                : nlohmann::json(100 * at80["val_accuracy"].get<double>()));
  }
}

// Per probed seed, the cheapest basis removal's loss increase (over every slot and basis).
std::vector<double> cheapest_removals(const nlohmann::json& probes) {
  std::vector<double> out;
  for (const auto& p : probes) {
    double lo = 1e300;
    for (const auto& s : p["slots"])
      for (double v : s["removed_loss"].get<std::vector<double>>()) lo = std::min(lo, v - p["loss"].get<double>());
    out.push_back(lo);
  }
  return out;
}

// The directions, chosen before running. Primary: IntBMoE beats top-2, the dense backbone and
// SMEAR as the paper matches them (top-2 on images is the headline).
void add_intb_directions(nlohmann::json& r) {
  const bool vision = r["setup"]["task"] == "classify";
  const auto& a = r["arms"];
  auto& dirs = r["directions"];
  auto beats = [&](const std::string& x, const std::string& y, bool primary, std::optional<PaperEffect> paper,
                   const std::string& text) {
    if (!a.contains(x) || !a.contains(y)) return;
    const auto d = vision ? paired_difference(seed_values(a[x], "accuracy"), seed_values(a[y], "accuracy"))
                          : paired_difference(seed_values(a[y], "val_loss"), seed_values(a[x], "val_loss"));
    const auto how =
        vision ? fmt::format("validation accuracy, {} - {}", x, y) : fmt::format("mean validation loss, {} - {}", y, x);
    dirs.push_back(direction_json(
        {text + " (" + how + ")", true, primary, paper, vision ? " points" : " nats", 1, vision ? 2 : 4}, d));
  };
  auto label = [&](const std::string& x) { return a[x]["label"].get<std::string>(); };
  const std::optional<PaperEffect> none;
  beats("intb", "top2", true,
        vision ? std::optional<PaperEffect>(
                     PaperEffect{1.98, "a lower bound: Table 1's sparse baselines all rank below SMEAR"})
               : none,
        "IntBMoE beats " + label("top2"));
  beats("intb", "dense", true,
        vision ? PaperEffect{7.36, "Table 1, ImageNet-1K top-1: 73.76 vs 66.40"}
               : PaperEffect{0.1324, "Table 3, MiniPile: PPL 12.4 % below dense"},
        "IntBMoE beats the " + label("dense"));
  beats("intb", "smear", true, vision ? std::optional<PaperEffect>(PaperEffect{1.98, "Table 1: 73.76 vs 71.78"}) : none,
        "IntBMoE beats " + label("smear"));
  for (const std::string x : {"dense_wide", "top2_total", "smear_total"})
    beats("intb", x, false, none, "at equal total parameters, IntBMoE beats " + label(x));
  std::vector<std::string> ablations;
  for (const auto& name : r["order"])
    if (a[name.get<std::string>()]["group"] == "ablation") ablations.push_back(name);
  for (const auto& x : ablations) beats("intb", x, false, none, label(x) + " is worse than IntBMoE");
  for (const auto& x : ablations)
    if (x != "no_gate") beats(x, "no_gate", false, none, "removing the gate path hurts more than " + label(x));
  if (r.value("early_pass", false) || !r.contains("probes")) return;
  const auto cheapest = cheapest_removals(r["probes"]);
  dirs.push_back(direction_json({"every basis costs something: the cheapest removal of one basis from one slot still "
                                 "raises the validation loss (per probed seed, no retraining)",
                                 true, false, std::nullopt, " nats"},
                                paired_difference(cheapest, std::vector<double>(cheapest.size(), 0.0))));
}

std::string run_dir(const Config& c) { return (std::filesystem::path(c.run.out_dir) / c.run.name).string(); }

nlohmann::json probe_of(const std::string& dir, int64_t windows) {
  auto model = open_evaluable(dir, windows);
  return intb_probe(model, "val").to_json();
}

}  // namespace

nlohmann::json intb_repro(ReproArgs args, const IntBReproOptions& opt) {
  auto base = repro_base_config(
      args, {"model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=2", "model.ffn_hidden=32",
             "model.moe.expert_hidden=32", "model.moe.intb.basis=4", "model.moe.intb.shared_hidden=16", "train.steps=8",
             "train.batch_size=4", "train.seq_len=16", "train.warmup_steps=2", "train.log_every=2", "eval.every=4",
             "eval.windows=4", "data.val_images=500"});
  if (base.model.ffn != "intb")
    throw ConfigError("repro intb: the base config must be an IntBMoE model (model.ffn = \"intb\")");
  const bool vision = base.model.task == "classify";
  if (!vision) base.model.vocab_size = PreparedCorpus(base.data.dir).vocab_size();
  const int64_t secondary = std::min(args.seeds, opt.secondary_seeds), probes = std::min(args.seeds, opt.probe_seeds);
  auto js = repro_results("intb", args.command_line("intb") + fmt::format("{} --secondary-seeds {} --probe-seeds {}",
                                                                          opt.ablations ? "" : " --no-ablations",
                                                                          opt.secondary_seeds, opt.probe_seeds));
  const auto& m = base.model;
  const auto& ib = m.moe.section<IntBConfig>();
  js["setup"] = {{"task", vision ? "classify" : "lm"},
                 {"d_model", m.d_model},
                 {"n_layers", m.n_layers},
                 {"moe_layers", m.moe.layers},
                 {"ffn_hidden", m.ffn_hidden},
                 {"blocks", m.moe.num_experts},
                 {"top_k", m.moe.top_k},
                 {"basis", ib.basis},
                 {"internal_layers", ib.internal_layers},
                 {"internal_width", m.moe.expert_hidden},
                 {"shared_hidden", ib.shared_hidden},
                 {"steps", base.train.steps},
                 {"lr", base.train.lr},
                 {"batch_size", base.train.batch_size},
                 {"seq_len", base.train.seq_len},
                 {"windows", base.eval.windows},
                 {"seeds", args.seeds},
                 {"secondary_seeds", secondary},
                 {"probe_seeds", probes},
                 {"threads", base.train.threads}};
  if (vision) {
    const ImageDataset images(base.data.images_dir, base.data.val_images, image_classes(base.data));
    js["setup"]["val_images"] = images.split("val").labels.size(0);
    js["setup"]["epochs"] = static_cast<double>(base.train.steps * base.train.batch_size) /
                            static_cast<double>(images.split("train").labels.size(0));
  }
  const int64_t target = total_parameters(base);
  const auto all = intb_arms(base, opt.ablations);
  std::map<std::string, Config> configs;
  for (const auto& arm : all) configs[arm.name] = arm_config(base, arm, target);
  auto seed_config = [&](const IntBArm& arm, int64_t s) {
    Config c = configs[arm.name];
    apply_override(c, fmt::format("train.seed={}", 1000 + s));
    apply_override(c, fmt::format("run.name=intb-{}-s{}", arm.name, s));
    return c;
  };
  auto seeds_of = [&](const IntBArm& arm) { return primary(arm.name) ? args.seeds : secondary; };
  share_training([&] {
    for (int64_t s = 0; s < args.seeds; ++s)
      for (const auto& arm : all) {
        if (s >= seeds_of(arm)) continue;
        const auto c = seed_config(arm, s);
        spdlog::info("repro intb: {} seed {}", arm.label, s);
        run_variant(c);
        if (arm.name == "intb" && s < probes)
          measure_when_finished({c}, "probe", [&] { return probe_of(run_dir(c), base.eval.windows); });
      }
  });
  std::vector<std::string> runs;
  for (const auto& arm : all) {
    js["order"].push_back(arm.name);
    auto& a = js["arms"][arm.name];
    a["label"] = arm.label;
    a["group"] = arm.group;
    a["parameters"] = total_parameters(configs[arm.name]);
    a["executed"] = executed_parameters(configs[arm.name]);
    for (int64_t s = 0; s < seeds_of(arm); ++s) {
      const auto c = seed_config(arm, s);
      runs.push_back(run_variant(c));
      collect_intb_quality(a, runs.back(), c);
      if (arm.name == "intb" && s < probes)
        js["probes"].push_back(
            run_measure(runs.back(), "probe", [&] { return probe_of(runs.back(), base.eval.windows); }));
    }
  }
  IntBBenchOptions bo;
  if (args.quick) bo.basis = {1, 4}, bo.iters = 1;
  js["cache_bench"] = run_measure(runs.front(), "cache_bench", [&] {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : bench_intb(bo))
      rows.push_back(
          {{"basis", r.basis}, {"cached_seconds", r.cached_seconds}, {"uncached_seconds", r.uncached_seconds}});
    return rows;
  });
  record_runs(js, runs);
  add_directions_with_early(js, add_intb_directions);
  return js;
}

}  // namespace mf
