// `moeforge repro unipool`: UniPool's ablation (paper Table 5) in miniature. Trains every arm
// with identical data, tokens and optimizer for several seeds, measures expert usage and the
// routing-randomization probe, and collects it all into results.json; render_unipool_results()
// turns that file alone into results.md. Finished runs are reused, so a stopped repro continues.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "methods/unipool/repro.h"

#include "analysis/expert_usage.h"
#include "core/util.h"
#include "io/model_io.h"
#include "methods/unipool/probe.h"
#include "train/repro_report.h"
#include "train/repro_stats.h"

namespace mf {
namespace {
namespace fs = std::filesystem;

struct PoolArm {
  std::string name, label;
  std::vector<std::string> sets;
  bool core = true;  // in the default design; the rest only with --all-arms
};

// The gate-scale controls give softmax top-1 a gate of NormRouter's scale (its weight starts
// near 1/N over N candidates, so a learnable scalar starting at N) while its router keeps a
// gradient: what the pool and NormRouter gain beyond gate scale.
std::vector<PoolArm> unipool_arms(int64_t moe_layers, int64_t experts) {
  const std::string pool = "model.moe.unipool.groups=1", pool_aux = "model.moe.unipool.aux_loss_coef=0.01";
  const std::string no_layer_aux = "model.moe.aux_loss_coef=0", norm = "model.moe.router=norm_topk";
  const std::string half = fmt::format("model.moe.unipool.pool_size={}", experts * moe_layers / 2);
  auto scale = [](int64_t n) { return fmt::format("model.moe.gate_scale={}", n); };
  return {
      {"vanilla", "vanilla MoE (softmax, per-layer Switch aux 1e-2)", {}},
      {"vanilla_scaled", fmt::format("vanilla + softmax x learnable scale (from {})", experts), {scale(experts)}},
      {"pool_pool_aux_scaled",
       fmt::format("shared pool + pool aux + softmax x learnable scale (from {})", experts * moe_layers),
       {pool, no_layer_aux, pool_aux, scale(experts * moe_layers)}},
      {"unipool", "full UniPool (G = 1, pool aux + NormRouter)", {pool, no_layer_aux, pool_aux, norm}},
      {"unipool_half",
       fmt::format("UniPool, reduced pool M = {}", experts * moe_layers / 2),
       {pool, half, no_layer_aux, pool_aux, norm}},
      {"pool_layer_aux", "shared pool + per-layer aux + softmax", {pool}, false},
      {"pool_pool_aux", "shared pool + pool aux + softmax", {pool, no_layer_aux, pool_aux}, false},
      {"vanilla_sigmoid", "vanilla + sigmoid router, no aux", {"model.moe.router=sigmoid_topk", no_layer_aux}, false},
      {"vanilla_norm", "vanilla + NormRouter", {norm}, false},
      {"unipool_g2", "UniPool, G = 2", {"model.moe.unipool.groups=2", no_layer_aux, pool_aux, norm}, false},
  };
}

// The directions, chosen before running: worse arm, better arm, the paper's number (Table 5, 182M:
// the worse arm's loss minus the better's).
struct Claim {
  std::string text, worse, better;
  bool primary = false;
  std::optional<PaperEffect> paper;
};
std::vector<Claim> unipool_claims() {
  return {
      {"full UniPool beats vanilla MoE", "vanilla", "unipool", true, PaperEffect{0.0288, "Table 5, 182M"}},
      {"full UniPool beats vanilla with a learnable softmax gate scale (the gate-scale control)", "vanilla_scaled",
       "unipool", true, std::nullopt},
      {"NormRouter helps under sharing beyond gate scale (UniPool beats the scaled-softmax pool)",
       "pool_pool_aux_scaled", "unipool", false, PaperEffect{0.0151, "Table 5, against the unscaled softmax pool"}},
      {"a half-size pool still beats vanilla", "vanilla", "unipool_half", false, std::nullopt},
      {"shared pool + per-layer aux is worse than vanilla", "pool_layer_aux", "vanilla", false,
       PaperEffect{0.0163, "Table 5, 182M"}},
      {"the pool-level aux beats the per-layer aux under sharing", "pool_layer_aux", "pool_pool_aux", false,
       PaperEffect{0.0300, "Table 5, 182M"}},
      {"NormRouter alone does not help vanilla MoE beyond gate scale", "vanilla_norm", "vanilla_scaled", false,
       std::nullopt},
      {"full UniPool beats vanilla with the sigmoid router, no aux", "vanilla_sigmoid", "unipool", false,
       PaperEffect{0.0210, "Table 5, 182M"}},
      {"G = 2 is worse than G = 1", "unipool_g2", "unipool", false, PaperEffect{0.0184, "Table 5, 182M"}},
  };
}

// The claims whose arms ran, as directions from r["arms"][*]["val_loss"]; the probe's direction
// too, except in the 80 % pass (it is measured on the final checkpoints).
void add_unipool_directions(nlohmann::json& r, bool probe) {
  auto losses = [&](const std::string& n) { return r["arms"][n]["val_loss"].get<std::vector<double>>(); };
  for (const auto& c : unipool_claims())
    if (r["arms"].contains(c.worse) && r["arms"].contains(c.better))
      r["directions"].push_back(direction_json(
          {c.text + " (val loss, " + c.worse + " - " + c.better + ")", true, c.primary, c.paper, " nats"},
          paired_difference(losses(c.worse), losses(c.better))));
  if (!probe || r.value("early_pass", false)) return;
  std::map<std::string, std::vector<double>> cost;
  for (const auto& [arm, mode] : {std::pair{"vanilla", "own"}, std::pair{"unipool", "matched"}})
    for (const auto& rep : r["probe"][arm]) cost[arm].push_back(rep["mean_delta"][mode].get<double>());
  r["directions"].push_back(direction_json(
      {"randomizing one deep-half layer's routing costs UniPool (cardinality-matched) more than vanilla (mean loss "
       "increase, UniPool - vanilla)",
       true, false, std::nullopt, " nats"},
      paired_difference(cost["unipool"], cost["vanilla"])));
}

}  // namespace

nlohmann::json unipool_repro(ReproArgs args, const UniPoolReproOptions& opt) {
  auto base =
      repro_base_config(args, {"model.d_model=64", "model.n_layers=2", "model.moe.expert_hidden=64", "train.steps=10",
                               "train.warmup_steps=2", "train.ckpt_every=10", "eval.every=10", "eval.windows=4"});
  const int64_t layers = num_moe_layers(base.model), E = base.model.moe.num_experts;
  std::string command = args.command_line("unipool");
  if (opt.all_arms) command += " --all-arms";
  if (!opt.probe) command += " --no-probe";
  auto js = repro_results("unipool", command);
  js["setup"] = {{"moe_layers", layers},
                 {"d_model", base.model.d_model},
                 {"top_k", base.model.moe.top_k},
                 {"experts", E},
                 {"expert_hidden", base.model.moe.expert_hidden},
                 {"init_std", base.model.init_std},
                 {"steps", base.train.steps},
                 {"tokens_per_step", base.train.batch_size * base.train.seq_len},
                 {"lr", base.train.lr},
                 {"seeds", args.seeds},
                 {"threads", base.train.threads}};
  std::vector<PoolArm> arms;
  for (auto& a : unipool_arms(layers, E))
    if (a.core || opt.all_arms) arms.push_back(a);
  auto arm_config = [&](const PoolArm& a, int64_t s) {
    Config cfg = base;
    for (auto& set : a.sets) apply_override(cfg, set);
    cfg.train.seed = 1000 + s;
    cfg.run.name = fmt::format("{}-s{}", a.name, s);
    validate(cfg);
    return cfg;
  };
  share_training([&] {  // seed-major: a stopped repro has whole seeds
    for (const auto& cfg : lr_sweep_configs(base, args.lr_sweep, "vanilla-s0")) run_variant(cfg);
    for (int64_t s = 0; s < args.seeds; ++s)
      for (auto& a : arms) {
        spdlog::info("repro unipool: {} seed {} ({})", a.name, s, a.label);
        run_variant(arm_config(a, s));
      }
  });
  if (!args.lr_sweep.empty()) js["lr_sweep"] = lr_sweep(base, args.lr_sweep, "vanilla-s0");
  std::vector<std::string> run_dirs;
  for (int64_t s = 0; s < args.seeds; ++s)
    for (auto& a : arms) {
      const auto dir = run_variant(arm_config(a, s));
      run_dirs.push_back(dir);
      auto& arm = js["arms"][a.name];
      arm["label"] = a.label;
      arm["val_loss"].push_back(nlohmann::json::parse(read_file(dir + "/summary.json"))["val_loss_mean"]);
      const double early = held_out_loss_at(dir, 0.8);
      arm["val_loss_80"].push_back(std::isfinite(early) ? nlohmann::json(early) : nlohmann::json());
      if (opt.probe && (a.name == "vanilla" || a.name == "unipool"))
        js["probe"][a.name].push_back(run_measure(dir, "probe", [&] {
          return routing_probe(open_evaluable(dir, base.eval.windows), ProbeOptions{}).to_json();
        }));
      if (s > 0) continue;
      const auto m = run_measure(dir, "usage", [&] {
        auto l = load_model(dir);
        const auto c = l.model->param_counts();
        return nlohmann::json{{"usage", measure_expert_usage(open_evaluable(dir, l.cfg.eval.windows), "val").to_json()},
                              {"expert_params", c.expert_stored},
                              {"vanilla_params", c.expert_vanilla}};
      });
      const auto u = ExpertUsage::from_json(m["usage"]);
      write_usage_pictures(u, (fs::path(args.out) / a.name).string(), a.label);
      arm.update({{"dead", u.globally_dead()},
                  {"stored_experts", u.stored_experts()},
                  {"expert_params", m["expert_params"]},
                  {"vanilla_params", m["vanilla_params"]}});
    }
  js["arm_order"] = nlohmann::json::array();
  for (auto& a : arms) js["arm_order"].push_back(a.name);
  record_runs(js, run_dirs);
  add_directions_with_early(js, [&](nlohmann::json& r) { add_unipool_directions(r, opt.probe); });
  return js;
}

std::string render_unipool_results(const nlohmann::json& js, const std::string& out_dir) {
  const auto& s = js["setup"];
  const auto seeds = s["seeds"].get<int64_t>();
  // results collected before the init was recorded (format 2 of 2026-12-03) render as they were
  const std::string init =
      s.contains("init_std")
          ? fmt::format(
                " weights initialised with std {:g} (the paper's 0.01 at hidden 768 would be {:.4f} at this "
                "width, 0.01 x sqrt(768 / d)),",
                s["init_std"].get<double>(), 0.01 * std::sqrt(768.0 / s["d_model"].get<double>()))
          : "";
  std::string md = fmt::format(
      "# UniPool ablation in miniature\n\n{}\n\n{} MoE layers, d = {}, top-{} of {} experts per layer (the pools hold "
      "{} x {} = {}), expert width {},{} {} steps x {} tokens at peak lr {:g}, {} thread(s) per run. Validation loss "
      "is the mean over the four domains (nats), mean ± std over {} seed(s). Dead = stored experts no layer routed to "
      "on the validation windows (seed 0).\n\n",
      results_header(js), s["moe_layers"].get<int64_t>(), s["d_model"].get<int64_t>(), s["top_k"].get<int64_t>(),
      s["experts"].get<int64_t>(), s["experts"].get<int64_t>(), s["moe_layers"].get<int64_t>(),
      s["experts"].get<int64_t>() * s["moe_layers"].get<int64_t>(), s["expert_hidden"].get<int64_t>(), init,
      s["steps"].get<int64_t>(), s["tokens_per_step"].get<int64_t>(), s["lr"].get<double>(),
      s["threads"].get<int64_t>(), seeds);
  md += lr_sweep_section(js);
  md +=
      "| arm | stored experts | expert params | % of vanilla | val loss | Δ vs vanilla | dead |\n"
      "|---|---|---|---|---|---|---|\n";
  auto stats = [](const nlohmann::json& arm) {
    Outcome o;
    o.loss = arm["val_loss"].get<std::vector<double>>();
    return o;
  };
  const double vanilla = stats(js["arms"]["vanilla"]).mean();
  for (const auto& name : js["arm_order"]) {
    const auto& a = js["arms"][name.get<std::string>()];
    const auto o = stats(a);
    md += fmt::format("| {} | {} | {:.2f} M | {:.0f} % | {:.4f} ± {} | {:+.4f} | {} |\n", a["label"].get<std::string>(),
                      a["stored_experts"].get<int64_t>(), a["expert_params"].get<int64_t>() / 1e6,
                      100.0 * a["expert_params"].get<double>() / std::max(1.0, a["vanilla_params"].get<double>()),
                      o.mean(), seeds > 1 ? fmt::format("{:.4f}", o.std()) : "n/a", o.mean() - vanilla,
                      a["dead"].get<int64_t>());
  }
  md += "\n" + directions_section(js);
  md +=
      "\nHeatmaps (seed 0): `<arm>_heatmap.svg` (share of each layer's pairs per expert), `<arm>_hist.svg` (usage per "
      "stored expert, dead in red).\n";
  if (js.contains("probe")) {
    md += "\n## Routing-randomization probe (test split; router weights kept, expert identities drawn uniformly)\n\n";
    for (const auto& arm : {"vanilla", "unipool"})
      md += fmt::format("### {} (seed 0)\n\n{}\n", arm, ProbeReport::from_json(js["probe"][arm][0]).markdown());
  }
  const auto span = loss_span(js);
  md += limits_section(
      js,
      {fmt::format("It can show whether, at equal data, tokens, optimizer and stored expert parameters, one pool "
                   "shared by {} layers and NormRouter change validation loss beyond the seed-to-seed noise, and "
                   "whether a change survives the gate-scale control (softmax × a learnable scale of NormRouter's "
                   "starting size).",
                   s["moe_layers"].get<int64_t>()),
       fmt::format("It cannot show the paper's claims at the paper's scale (182M-978M parameters, 30B tokens): here "
                   "d = {}, {} steps × {} tokens of one small corpus. The runs end at {:.2f}-{:.2f} nats against the "
                   "corpus's unigram entropy of {:.2f} (the initial plateau). A difference here may be one of "
                   "optimisation speed rather than of the loss a longer run reaches.",
                   s["d_model"].get<int64_t>(), s["steps"].get<int64_t>(), s["tokens_per_step"].get<int64_t>(), span.lo,
                   span.hi, span.unigram)},
      "Dead experts and heatmaps come from seed 0; the probe randomizes one deep-half layer at a time.");
  (void)out_dir;
  return md;
}

}  // namespace mf
