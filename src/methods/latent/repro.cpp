// `moeforge repro latent`: LatentMoE's shape and allocation experiments in miniature.
// (1) shape sweep at fixed l*m, N, K with ms chosen to keep Q, hence the layer's parameters and
//     MACs per token (the paper's main sweep): validation loss against l/m (expect a U); the
//     same at fixed ms (the paper's appendix control);
// (2) ID-guided allocation: a short proxy run's TwoNN profile picks the two-segment split;
//     two-segment vs uniform narrow (l = 3/4 of the reference's), uniform wide (3/2), the
//     swapped and reversed placements and the boundary moved by one, each layer cost-matched to the reference (P, C, V,
//     Q deviations printed); both endpoints must obey the near-square rule |l/m - 1| <= 0.4.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <limits>

#include "methods/latent/repro.h"

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "io/model_io.h"
#include "methods/latent/intrinsic_dim.h"
#include "methods/latent/latent.h"
#include "methods/latent/shape.h"

namespace mf {
namespace {
namespace fs = std::filesystem;

struct Arm {
  std::string name, latent;  // model.moe.latent of the arm
  double deviation = 0;      // largest |relative deviation| of P, C, V, Q from the reference
  Outcome outcome;
};

void train_arms(std::vector<Arm>& arms, const Config& base, int64_t seeds) {
  for (int64_t s = 0; s < seeds; ++s)
    for (auto& a : arms) {
      Config cfg = base;
      cfg.model.moe.section<LatentConfig>().shapes = a.latent;
      cfg.train.seed = 1000 + s;
      cfg.run.name = fmt::format("{}-s{}", a.name, s);
      validate(cfg);
      spdlog::info("repro latent: {} seed {} (latent = \"{}\")", a.name, s, a.latent);
      auto dir = run_variant(cfg);
      a.outcome.loss.push_back(nlohmann::json::parse(read_file(dir + "/summary.json"))["val_loss_mean"].get<double>());
    }
}

std::string arms_table(const std::vector<Arm>& arms, bool with_dev, int64_t d) {
  std::string md = with_dev ? "| arm | model.moe.latent.shapes | max cost deviation | val loss |\n|---|---|---|---|\n"
                            : "| arm | model.moe.latent.shapes | parameters / MACs per token (layer) | val loss |\n"
                              "|---|---|---|---|\n";
  for (auto& a : arms) {
    const auto std = a.outcome.loss.size() > 1 ? fmt::format("{:.4f}", a.outcome.std()) : std::string("n/a");
    const auto c = latent_cost(d, parse_latent_shapes(a.latent)[0]);
    md += with_dev ? fmt::format("| {} | `{}` | {:.2f} % | {:.4f} ± {} |\n", a.name, a.latent, 100 * a.deviation,
                                 a.outcome.mean(), std)
                   : fmt::format("| {} | `{}` | {:.3f} M / {:.3f} M | {:.4f} ± {} |\n", a.name, a.latent,
                                 c.params / 1e6, c.macs / 1e6, a.outcome.mean(), std);
  }
  return md;
}

// |l/m - 1| <= 0.4 (the paper's near-square rule for the allocation's endpoints)
void require_near_square(const MoELayerShape& s, const std::string& which) {
  const double aspect = static_cast<double>(s.latent) / static_cast<double>(s.expert_hidden);
  if (std::abs(aspect - 1) > 0.4 + 1e-9)
    throw ConfigError(fmt::format(
        "repro latent: the {} endpoint l,m = {},{} breaks the near-square rule |l/m - 1| <= 0.4 (l/m = {:.2f}); "
        "choose another reference in model.moe.latent.shapes",
        which, s.latent, s.expert_hidden, aspect));
}

std::string repeat_shape(const MoELayerShape& s, int64_t n) {
  return format_latent_shapes(std::vector<MoELayerShape>(n, s));
}

}  // namespace

ReproResult latent_repro(ReproArgs args, int64_t multiple) {
  const auto t0 = std::chrono::steady_clock::now();
  auto base = repro_base_config(
      args, {"model.d_model=64", "model.n_layers=2", "model.moe.latent.shapes=32,40,6,3,64", "train.steps=10",
             "train.warmup_steps=2", "train.ckpt_every=10", "eval.every=10", "eval.windows=4"});
  const auto& out = args.out;
  const int64_t seeds = args.seeds;
  const bool quick = args.quick;
  const auto& reference = base.model.moe.section<LatentConfig>().shapes;
  const auto refs = parse_latent_shapes(reference);
  if (refs.size() != 1)
    throw ConfigError("repro latent: the base config needs one model.moe.latent.shapes entry (the reference)");
  const auto ref = refs[0];
  const int64_t d = base.model.d_model, L = num_moe_layers(base.model);

  // (1) shape sweep: l * m, N, K fixed; ms keeps Q (main) or stays (appendix control)
  const double q_ref = latent_cost(d, ref).Q;
  std::vector<Arm> sweep, fixed_ms;
  for (int64_t l : {ref.latent / 4, ref.latent / 2, ref.latent, ref.latent * 2}) {
    if (l < 1 || l > d || (ref.latent * ref.expert_hidden) % l != 0) continue;
    MoELayerShape s = ref;
    s.latent = l;
    s.expert_hidden = ref.latent * ref.expert_hidden / l;
    if (l != ref.latent)
      fixed_ms.push_back({fmt::format("l{}_m{}_fixed_ms", l, s.expert_hidden), repeat_shape(s, L), 0, {}});
    const double ms = (q_ref - 2.0 * static_cast<double>(l) - static_cast<double>(s.num_experts)) / 3;
    if (ms < 0) continue;  // no shared width can make up for so wide a latent
    s.shared_hidden = std::llround(ms / static_cast<double>(multiple)) * multiple;
    sweep.push_back({fmt::format("l{}_m{}", l, s.expert_hidden), repeat_shape(s, L), 0, {}});
  }
  train_arms(sweep, base, seeds);
  train_arms(fixed_ms, base, seeds);

  // (2) proxy run -> ID profile -> split; arms cost-matched to the reference
  Config proxy = base;
  proxy.model.moe.section<LatentConfig>().shapes = repeat_shape(ref, L);
  proxy.train.steps = std::max<int64_t>(10, base.train.steps / 3);
  proxy.eval.every = 0;
  proxy.run.name = "proxy";
  auto proxy_dir = run_variant(proxy);
  auto loaded = load_model(proxy_dir);
  PreparedCorpus corpus(base.data.dir);
  auto prof = intrinsic_dimension_profile(loaded.model, corpus, "val", base.train.seq_len, quick ? 2000 : 20000,
                                          quick ? 500 : 5000, 0);
  int64_t split = two_segment_split(prof.id);
  const bool fallback = split <= 0;
  if (fallback) split = std::max<int64_t>(1, L / 2);
  const int64_t narrow = ref.latent * 3 / 4, wide = std::min(d - 1, ref.latent * 3 / 2);
  const auto sn = solve_constant_cost(d, ref, narrow, multiple);
  const auto sw = solve_constant_cost(d, ref, wide, multiple);
  require_near_square(sn.rounded, "narrow");
  require_near_square(sw.rounded, "wide");
  auto narrow_in = [&](int64_t begin, int64_t end) {  // blocks [begin, end) narrow, the others wide
    std::vector<MoELayerShape> v;
    for (int64_t i = 0; i < L; ++i) v.push_back(i >= begin && i < end ? sn.rounded : sw.rounded);
    return format_latent_shapes(v);
  };
  const double dev = std::max(sn.max_abs_deviation(), sw.max_abs_deviation());
  // the paper's controls: uniform endpoints; the fixed split with the regimes swapped; the same
  // count of narrow blocks at the end (order reversed); the boundary moved by one either way
  std::vector<Arm> alloc = {{"two_segment", narrow_in(0, split), dev, {}},
                            {"uniform_narrow", repeat_shape(sn.rounded, L), sn.max_abs_deviation(), {}},
                            {"uniform_wide", repeat_shape(sw.rounded, L), sw.max_abs_deviation(), {}},
                            {"swapped", narrow_in(split, L), dev, {}}};
  if (L - split != split) alloc.push_back({"reversed", narrow_in(L - split, L), dev, {}});
  if (split - 1 >= 1) alloc.push_back({"boundary_minus_1", narrow_in(0, split - 1), dev, {}});
  if (split + 1 <= L - 1) alloc.push_back({"boundary_plus_1", narrow_in(0, split + 1), dev, {}});
  train_arms(alloc, base, seeds);
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60;

  // pictures and tables
  Series u{"validation loss", {}, {}};
  for (auto& a : sweep) {
    auto s = parse_latent_shapes(a.latent)[0];
    u.x.push_back(std::log2(static_cast<double>(s.latent) / static_cast<double>(s.expert_hidden)));
    u.y.push_back(a.outcome.mean());
  }
  write_file_atomic((fs::path(out) / "shape_sweep.svg").string(),
                    line_chart_svg({u}, {"shape sweep at fixed l*m", "log2(l / m)", "validation loss (nats)"}));
  Series idp{"TwoNN ID (proxy run)", {}, prof.id};
  for (size_t i = 0; i < prof.id.size(); ++i) idp.x.push_back(static_cast<double>(i));
  write_file_atomic((fs::path(out) / "id_profile.svg").string(),
                    line_chart_svg({idp}, {"intrinsic dimension per block", "block", "TwoNN ID"}));
  std::string md = fmt::format(
      "# LatentMoE shaping in miniature\n\nProduced by `{} --multiple {}` (d = {}, {} MoE "
      "layers, reference layer l,m,N,K,ms = {}; {} steps x {} tokens). Validation loss = mean over the four domains "
      "(nats), mean ± std over {} seed(s). Total runtime {:.1f} min on {} threads. Balancing: {}.\n\n"
      "## (1) Shape sweep at l·m = {}, N = {}, K = {}; ms keeps the layer's parameters and MACs (Q = {:.0f})\n\n"
      "{}\n![](shape_sweep.svg)\n\nAppendix control, ms = {} fixed (cost grows with l):\n\n{}\n"
      "## (2) ID-guided allocation\n\nProxy run: {} steps of the reference model; TwoNN ID per block ({} of {} "
      "validation tokens, seed 0): {}. Split: blocks 0..{} narrow (l = {}), the rest wide (l = {}){}.\n\n"
      "Narrow layer {} ({}); wide layer {} ({}).\n\n{}\n![](id_profile.svg)\n\n## The paper's directions at this "
      "scale (paired by seed: difference ± standard error)\n\n",
      args.command_line("latent"), multiple, d, L, reference, base.train.steps,
      base.train.batch_size * base.train.seq_len, seeds, minutes, base.train.threads,
      fmt::format("Switch aux {:g}, z-loss {:g}, aux-free bias step {:g}", base.model.moe.aux_loss_coef,
                  base.model.moe.z_loss_coef, base.model.moe.bias_update),
      ref.latent * ref.expert_hidden, ref.num_experts, ref.top_k, q_ref, arms_table(sweep, false, d), ref.shared_hidden,
      arms_table(fixed_ms, false, d), proxy.train.steps, prof.tokens_used, prof.tokens_collected,
      [&] {
        std::string s;
        for (double v : prof.id) s += fmt::format("{}{:.1f}", s.empty() ? "" : ", ", v);
        return s;
      }(),
      split - 1, narrow, wide, fallback ? " (no valid split in the profile: fell back to the middle)" : "",
      format_latent_shapes({sn.rounded}), sn.deviations(), format_latent_shapes({sw.rounded}), sw.deviations(),
      arms_table(alloc, true, d));
  nlohmann::json js = {{"minutes", minutes}, {"id_profile", prof.id}, {"split", split}, {"split_fallback", fallback}};
  for (auto* v : {&sweep, &fixed_ms, &alloc})
    for (auto& a : *v)
      js["arms"][a.name] = {{"latent", a.latent}, {"val_loss", a.outcome.loss}, {"deviation", a.deviation}};
  auto loss = [](const std::vector<Arm>& v, const std::string& n) {
    for (auto& a : v)
      if (a.name == n) return a.outcome.loss;
    return std::vector<double>{};
  };
  auto direction = [&](const std::string& text, const std::vector<double>& worse, const std::vector<double>& better) {
    report_direction(md, js, text, paired_difference(worse, better), true);
  };
  const Arm* square = nullptr;
  for (auto& a : sweep)
    if (parse_latent_shapes(a.latent)[0].latent == ref.latent) square = &a;
  if (square)
    for (const Arm* extreme : {&sweep.front(), &sweep.back()})
      if (extreme != square)
        direction(fmt::format("U shape: the near-square expert beats {} (val loss, {} - {})", extreme->name,
                              extreme->name, square->name),
                  extreme->outcome.loss, square->outcome.loss);
  direction("two-segment allocation beats uniform narrow (val loss, uniform_narrow - two_segment)",
            loss(alloc, "uniform_narrow"), loss(alloc, "two_segment"));
  direction("two-segment allocation beats uniform wide (val loss, uniform_wide - two_segment)",
            loss(alloc, "uniform_wide"), loss(alloc, "two_segment"));
  direction("two-segment beats the swapped placement (val loss, swapped - two_segment)", loss(alloc, "swapped"),
            loss(alloc, "two_segment"));
  for (const auto& a : alloc)
    if (a.name == "reversed" || a.name.rfind("boundary_", 0) == 0)
      direction("two-segment beats the " + a.name + " control (val loss, " + a.name + " - two_segment)", a.outcome.loss,
                loss(alloc, "two_segment"));
  for (std::string uniform : {"uniform_narrow", "uniform_wide"})
    direction("the swapped placement is worse than " + uniform + " (val loss, swapped - " + uniform + ")",
              loss(alloc, "swapped"), loss(alloc, uniform));
  std::vector<double> losses;
  for (auto* v : {&sweep, &fixed_ms, &alloc})
    for (auto& a : *v) losses.insert(losses.end(), a.outcome.loss.begin(), a.outcome.loss.end());
  md += fmt::format(
      "\n## What this miniature can and cannot show\n\n"
      "- It can show whether, at constant layer parameters and MACs per token, validation loss depends on the "
      "expert's aspect l/m at fixed l·m (the U shape), and whether the ID-guided two-segment allocation beats the "
      "uniform endpoints and the placement controls beyond the seed-to-seed noise, at d = {} with {} MoE layers.\n"
      "- It cannot show the paper's claims at the paper's scale: {} steps × {} tokens of one small corpus. {} A "
      "difference here may be one of optimisation speed rather than of the loss a longer run reaches. The ID profile "
      "comes from one {}-step proxy run, so the split is the same for every seed, and with {} blocks the boundary has "
      "only {} position{}.\n"
      "- With {} seed{}, a difference within two standard errors is \"not resolved\", which is not evidence of no "
      "effect.\n",
      d, L, base.train.steps, base.train.batch_size * base.train.seq_len, loss_against_unigram(losses, proxy_dir),
      proxy.train.steps, L, L - 1, L - 1 == 1 ? "" : "s", seeds, seeds == 1 ? "" : "s");
  return {out, md, js};
}

}  // namespace mf
