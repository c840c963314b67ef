// `moeforge repro umoe`: UMoE against direct domain fine-tuning in miniature, in a fine-grained
// MoE (many narrow experts, top-k of several). A vanilla MoE LM is pretrained on the mixed
// corpus and its experts' domain specialisation measured (routing JSD between domains); then per
// seed three fine-tunes on one domain with the same steps, recipe and batches: Direct SFT, UMoE
// and the one-sided ablation, their held-out losses logged at four points. The mechanism
// analyses follow (the low-saliency half's routed share; pruning it without retraining). Every
// number goes to results.json; render_umoe_results() (repro_render.cpp) writes results.md.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "core/util.h"
#include "io/model_io.h"
#include "methods/umoe/repro.h"
#include "methods/umoe/specialisation.h"
#include "methods/umoe/umoe.h"
#include "train/evaluable.h"
#include "train/metrics.h"
#include "train/repro_report.h"
#include "train/repro_stats.h"

namespace mf {
namespace {
namespace fs = std::filesystem;

struct SftArm {
  std::string name, label;
  bool surgery = false, one_sided = false;
};
const std::vector<SftArm>& sft_arms() {
  static const std::vector<SftArm> a = {{"direct", "Direct SFT", false, false},
                                        {"umoe", "UMoE (symmetric perturbation)", true, false},
                                        {"one_sided", "UMoE, one-sided perturbation", true, true}};
  return a;
}
// where the held-out losses are read, as fractions of the fine-tune (300 / 600 / 1,000 / 1,500 of 1,500)
const std::vector<double> kPoints = {0.2, 0.4, 2.0 / 3, 1.0};

// The target domain's loss and the mean of the others' in one per-domain evaluation.
std::pair<double, double> split_domains(const std::map<std::string, double>& loss, const std::string& target) {
  double others = 0;
  int n = 0;
  for (const auto& [d, v] : loss)
    if (d != target) others += v, ++n;
  return {loss.at(target), n ? others / n : 0.0};
}

std::map<std::string, double> evaluated(const std::string& dir, int64_t windows) {
  std::map<std::string, double> out;
  for (const auto& d : open_evaluable(dir, windows).evaluate("val", {})) out[d.domain] = d.loss;
  return out;
}

// From a finished fine-tune's records: the per-domain held-out losses at each point (the last
// evaluation at or before it) and the logged training losses.
struct Curves {
  std::vector<std::map<std::string, double>> at;  // per point
  std::vector<double> steps, train;
};
Curves read_curves(const std::string& dir, double steps) {
  Curves c;
  c.at.resize(kPoints.size());
  for (const auto& r : read_metrics(dir + "/metrics.jsonl")) {
    if (!r.contains("step")) continue;
    const double s = r["step"].get<double>();
    if (r.contains("loss")) c.steps.push_back(s), c.train.push_back(r["loss"].get<double>());
    if (r.contains("val_loss") && r["val_loss"].is_object())
      for (size_t p = 0; p < kPoints.size(); ++p)
        if (s <= kPoints[p] * steps + 1e-9) c.at[p] = r["val_loss"].get<std::map<std::string, double>>();
  }
  if (c.train.empty()) throw std::runtime_error(dir + "/metrics.jsonl has no training loss");
  return c;
}

// Per layer and domain, the routed pairs per expert of the pretrained model on each domain's
// calibration windows; the target domain's saliency for the picture.
nlohmann::json specialisation(const std::string& pretrained, const Config& base, int64_t samples,
                              const std::string& target) {
  nlohmann::json out;
  std::vector<std::vector<std::vector<double>>> counts;
  for (const std::string domain : {"dictionary", "quotations", "scripture", "technical"}) {
    const auto sal = checkpoint_saliency(pretrained, {"domain:" + domain, samples, 0, base.data.dir}, 8, false);
    counts.emplace_back();
    for (const auto& l : sal) counts.back().emplace_back(l.tokens.begin(), l.tokens.end());
    out["routed"][domain] = counts.back();
    if (domain == target) out["saliency"] = saliency_json(sal);
  }
  out["jsd"] = domain_divergence(counts);
  return out;
}

// The low-saliency half of a fine-tuned model: its routed share, and the target loss without it.
nlohmann::json posthoc(const std::string& dir, const CalibrationSource& calib, const UMoEReproOptions& opt,
                       int64_t windows, const fs::path& work) {
  SurgeryOptions p;
  p.prune = opt.prune;
  p.prune_only = true;
  const auto out = (work / "umoe-posthoc" / fs::path(dir).filename()).string();
  const auto r = run_umoe(dir, calib, p, out);
  double share = 0;
  for (size_t i = 0; i < r.saliency.size(); ++i)
    share += pair_share(r.saliency[i], r.surgery.layers[i].pruned) / static_cast<double>(r.saliency.size());
  return {{"low_share", share}, {"pruned_target", evaluated(out, windows).at(opt.domain)}};
}

// The directions, chosen before running (the primary: UMoE's target loss below Direct SFT's).
void add_umoe_directions(nlohmann::json& r) {
  auto v = [&](const std::string& arm, const std::string& key) {
    return r["arms"][arm][key].get<std::vector<double>>();
  };
  const auto domain = r["setup"]["domain"].get<std::string>();
  auto& dirs = r["directions"];
  dirs.push_back(
      direction_json({fmt::format("UMoE ends with a lower {} val loss than Direct SFT (direct - UMoE)", domain), true,
                      true, std::nullopt, " nats"},
                     paired_difference(v("direct", "val_loss"), v("umoe", "val_loss"))));
  dirs.push_back(direction_json(
      {fmt::format("symmetric perturbation beats one-sided ({} val loss, one-sided - symmetric)", domain), true, false,
       std::nullopt, " nats"},
      paired_difference(v("one_sided", "val_loss"), v("umoe", "val_loss"))));
  if (r.value("early_pass", false)) return;  // the rest are not held-out losses of the fine-tunes
  auto cost = [&](const std::string& arm) {
    std::vector<double> c;
    const auto pruned = v(arm, "pruned_target"), target = v(arm, "val_loss");
    for (size_t i = 0; i < pruned.size(); ++i) c.push_back(pruned[i] - target[i]);
    return c;
  };
  dirs.push_back(direction_json({"pruning the low-saliency half without retraining costs UMoE more than Direct SFT "
                                 "(loss increase, UMoE - direct)",
                                 true, false, std::nullopt, " nats"},
                                paired_difference(cost("umoe"), cost("direct"))));
  dirs.push_back(direction_json({"UMoE starts with a higher training loss (first logged step, UMoE - direct)", true,
                                 false, std::nullopt, " nats"},
                                paired_difference(v("umoe", "first_train"), v("direct", "first_train"))));
  dirs.push_back(
      direction_json({"UMoE ends with a lower training loss (mean of the last three logged steps, direct - UMoE)", true,
                      false, PaperEffect{0.008, "final training loss 0.404 vs 0.396, Qwen3-30B-A3B"}, " nats"},
                     paired_difference(v("direct", "last_train"), v("umoe", "last_train"))));
}

// Every measured number of one finished fine-tune, appended to its arm.
void collect_run(nlohmann::json& arm, const std::string& dir, const Config& cfg, const UMoEReproOptions& opt,
                 const nlohmann::json& post) {
  const auto c = read_curves(dir, static_cast<double>(cfg.train.steps));
  const auto summary = nlohmann::json::parse(read_file(dir + "/summary.json"));
  const auto [target, others] = split_domains(summary["val_loss"].get<std::map<std::string, double>>(), opt.domain);
  arm["val_loss"].push_back(target);
  arm["others"].push_back(others);
  std::map<std::string, double> at80;
  for (const auto& r : read_metrics(dir + "/metrics.jsonl"))
    if (r.contains("val_loss") && r["val_loss"].is_object() && r["step"].get<double>() <= 0.8 * cfg.train.steps + 1e-9)
      at80 = r["val_loss"].get<std::map<std::string, double>>();
  arm["val_loss_80"].push_back(at80.count(opt.domain) ? nlohmann::json(at80[opt.domain]) : nlohmann::json());
  for (size_t p = 0; p < kPoints.size(); ++p) {
    const bool seen = c.at[p].count(opt.domain) > 0;
    const auto [t, o] = seen ? split_domains(c.at[p], opt.domain) : std::pair<double, double>{NAN, NAN};
    arm["at"][p]["target"].push_back(seen ? nlohmann::json(t) : nlohmann::json());
    arm["at"][p]["others"].push_back(seen ? nlohmann::json(o) : nlohmann::json());
  }
  arm["first_train"].push_back(c.train.front());
  const size_t tail = std::min<size_t>(3, c.train.size());
  double last = 0;
  for (size_t i = c.train.size() - tail; i < c.train.size(); ++i) last += c.train[i] / static_cast<double>(tail);
  arm["last_train"].push_back(last);
  arm["curves"].push_back({{"steps", c.steps}, {"loss", c.train}});
  if (!post.is_null()) {
    arm["low_share"].push_back(post["low_share"]);
    arm["pruned_target"].push_back(post["pruned_target"]);
  }
}

}  // namespace

nlohmann::json umoe_repro(ReproArgs args, const UMoEReproOptions& opt) {
  auto base = repro_base_config(
      args, {"model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=2", "model.moe.num_experts=8",
             "model.moe.top_k=2", "model.moe.expert_hidden=16", "train.steps=8", "train.batch_size=4",
             "train.seq_len=16", "train.warmup_steps=2", "train.log_every=2", "eval.every=4", "eval.windows=4"});
  check_reap_model(base.model);
  const int64_t finetune = args.quick ? 10 : opt.finetune_steps;
  const int64_t samples = args.quick ? 8 : opt.calib_samples;
  auto js = repro_results(
      "umoe",
      args.command_line("umoe") +
          fmt::format(" --domain {} --finetune-steps {} --finetune-lr {:g} --calib-samples {} --prune {:g} "
                      "--sigma {:g}",
                      opt.domain, opt.finetune_steps, opt.finetune_lr, opt.calib_samples, opt.prune, opt.sigma));
  const auto& m = base.model;
  js["setup"] = {{"domain", opt.domain},
                 {"d_model", m.d_model},
                 {"blocks", m.n_layers},
                 {"experts", m.moe.num_experts},
                 {"top_k", m.moe.top_k},
                 {"expert_hidden", m.moe.expert_hidden},
                 {"renormalize", m.moe.renormalize},
                 {"pretrain_steps", base.train.steps},
                 {"pretrain_lr", base.train.lr},
                 {"finetune_steps", finetune},
                 {"finetune_lr", opt.finetune_lr},
                 {"tokens_per_step", base.train.batch_size * base.train.seq_len},
                 {"calib_samples", samples},
                 {"prune", opt.prune},
                 {"sigma", opt.sigma},
                 {"seeds", args.seeds},
                 {"windows", base.eval.windows},
                 {"threads", base.train.threads}};
  base.run.name = "umoe-pretrain";
  base.train.seed = 1000;  // the lr sweep's seed, so the sweep's run at the chosen lr is this run
  share_training([&] {
    for (const auto& cfg : lr_sweep_configs(base, args.lr_sweep, base.run.name)) run_variant(cfg);
    run_variant(base);
  });
  if (!args.lr_sweep.empty()) js["lr_sweep"] = lr_sweep(base, args.lr_sweep, base.run.name);
  const auto pretrained = run_variant(base);
  spdlog::info("repro umoe: the pretrained experts' domain specialisation");
  js["specialisation"] =
      run_measure(pretrained, "specialisation", [&] { return specialisation(pretrained, base, samples, opt.domain); });
  const CalibrationSource calib{"domain:" + opt.domain, samples, 0, base.data.dir};
  const auto work = fs::path(base.run.out_dir);
  // every fine-tune's config and initial weights (made by the part that trains it), seed-major
  auto finetune_config = [&](const SftArm& arm, int64_t s) {
    Config cfg = checkpoint_config(pretrained);
    weight_domains(cfg, opt.domain, true);
    apply_finetune(cfg, finetune, opt.finetune_lr, s, fmt::format("umoe-{}-s{}", arm.name, s));
    apply_override(cfg, fmt::format("eval.every={}", std::max<int64_t>(1, finetune / 15)));
    validate(cfg);
    return cfg;
  };
  auto init_of = [&](const SftArm& arm, const Config& cfg, int64_t s) {
    if (!arm.surgery) return pretrained;
    const auto init = (work / "umoe-init" / cfg.run.name).string();
    if (trains_here(cfg) && !fs::exists(init + "/model.safetensors")) {
      SurgeryOptions so;
      so.prune = opt.prune;
      so.sigma = opt.sigma;
      so.seed = static_cast<uint64_t>(s);
      so.one_sided = arm.one_sided;
      run_umoe(pretrained, calib, so, init);
    }
    return init;
  };
  share_training([&] {
    for (int64_t s = 0; s < args.seeds; ++s)
      for (const auto& arm : sft_arms()) {
        const auto cfg = finetune_config(arm, s);
        spdlog::info("repro umoe: {} seed {}", arm.label, s);
        run_variant(cfg, init_of(arm, cfg, s));
      }
  });
  std::vector<std::string> runs = {pretrained};
  for (int64_t s = 0; s < args.seeds; ++s)
    for (const auto& arm : sft_arms()) {
      const auto cfg = finetune_config(arm, s);
      const auto dir = run_variant(cfg, init_of(arm, cfg, s));
      runs.push_back(dir);
      const auto post = arm.one_sided ? nlohmann::json() : run_measure(dir, "posthoc", [&] {
        return posthoc(dir, calib, opt, base.eval.windows, work);
      });
      auto& a = js["arms"][arm.name];
      a["label"] = arm.label;
      collect_run(a, dir, cfg, opt, post);
    }
  js["points"] = nlohmann::json::array();
  for (double p : kPoints) js["points"].push_back(std::lround(p * static_cast<double>(finetune)));
  record_runs(js, runs);
  add_directions_with_early(js, add_umoe_directions);
  return js;
}

}  // namespace mf
