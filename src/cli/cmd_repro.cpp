// `moeforge repro ...`: flags only; each method's driver (src/methods/*/repro.cpp) trains and
// measures, and this file prints its results and writes results.md / results.json.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "analysis/report.h"
#include "cli/commands.h"
#include "core/util.h"
#include "methods/intb/repro.h"
#include "methods/latent/repro.h"
#include "methods/umoe/repro.h"
#include "methods/unif/repro.h"
#include "methods/unipool/repro.h"

namespace mf::cli {
namespace {

void add_repro_options(CLI::App* cmd, ReproArgs& a) {
  cmd->add_option("--config", a.config, "base config")->check(CLI::ExistingFile);
  cmd->add_option("--out", a.out, "where results.md, results.json and the SVGs go");
  cmd->add_option("--seeds", a.seeds, "seeds per arm (train.seed = 1000 + s)")->check(CLI::Range(1, 20));
  cmd->add_flag("--quick", a.quick, "smoke run: a tiny model, 10 steps, one seed");
  cmd->add_option("--set", a.sets, "override a key of the base config (repeatable)")->type_name("KEY=VALUE");
}

void add_finetune_options(CLI::App* cmd, int64_t& steps, double& lr) {
  cmd->add_option("--finetune-steps", steps, "fine-tuning steps per arm")->capture_default_str();
  cmd->add_option("--finetune-lr", lr, "fine-tuning peak learning rate")->capture_default_str();
}

void write_results(ReproResult r) {
  namespace fs = std::filesystem;
  if (!variant_runs().empty()) {  // every run of the reproduction on one page, linked from results.md
    write_report(variant_runs(), (fs::path(r.out_dir) / "report.html").string(),
                 "moeforge report: " + fs::path(r.out_dir).filename().string() + " reproduction");
    const auto link = fmt::format(
        "\nEvery run of this reproduction (curves, routing, usage): [report.html](report.html) "
        "(`moeforge report {} ...`).\n",
        variant_runs().front());
    const auto limits = r.markdown.find("\n## What this miniature can and cannot show");  // stays last
    r.markdown.insert(limits == std::string::npos ? r.markdown.size() : limits, link);
  }
  write_file_atomic((fs::path(r.out_dir) / "results.md").string(), r.markdown);
  write_file_atomic((fs::path(r.out_dir) / "results.json").string(), r.json.dump(2) + "\n");
  std::cout << r.markdown << "\nwrote " << (fs::path(r.out_dir) / "results.md").string() << "\n";
}

}  // namespace

void register_repro_commands(CLI::App& app) {
  auto* repro = app.add_subcommand("repro", "miniature reproductions of the papers' experiments");
  repro->require_subcommand(1);

  auto* up = repro->add_subcommand(
      "unipool",
      "UniPool ablation in miniature: vanilla MoE, shared pool with per-layer or pool aux, NormRouter, "
      "full UniPool, a half-size pool, G = 2, and the gate-scale controls (softmax x a learnable scale, sigmoid "
      "router); table with paired differences, heatmaps and routing probe under --out");
  static ReproArgs unipool_args{"configs/repro/unipool.toml", "docs/repro/unipool", {}, 3};
  static bool g2 = true, probe = true;
  add_repro_options(up, unipool_args);
  up->add_flag("!--no-g2", g2, "skip the G = 2 arm");
  up->add_flag("!--no-probe", probe, "skip the routing-randomization probe");
  up->callback([] { write_results(unipool_repro(unipool_args, g2, probe)); });

  auto* lt = repro->add_subcommand(
      "latent",
      "LatentMoE in miniature: shape sweep at fixed l*m and layer cost (U shape; fixed-ms control) and the "
      "ID-guided two-segment allocation vs uniform and swapped, cost-matched");
  static ReproArgs latent_args{"configs/repro/latent.toml", "docs/repro/latent", {}, 3};
  static int64_t multiple = 8;
  add_repro_options(lt, latent_args);
  lt->add_option("--multiple", multiple, "rounding multiple of the solver")->check(CLI::PositiveNumber);
  lt->callback([] { write_results(latent_repro(latent_args, multiple)); });

  auto* uf = repro->add_subcommand(
      "unif",
      "UniF-MoE in miniature: pretrain a dense ViT, upcycle two blocks into top-2, top-1, top-p and UniF-MoE (and "
      "its three ablations), fine-tune each identically per seed; accuracy, activated blocks, slot inference time");
  static ReproArgs unif_args{"configs/repro/unif.toml", "docs/repro/unif", {}, 3};
  static UniFReproOptions unif_opt;
  add_repro_options(uf, unif_args);
  uf->add_option("--layers", unif_opt.layers, "blocks to upcycle")->capture_default_str();
  uf->add_option("--experts", unif_opt.experts, "experts K per upcycled block")->capture_default_str();
  uf->add_option("--blocks", unif_opt.blocks, "UniF-MoE blocks B per expert")->capture_default_str();
  uf->add_option("--top-p", unif_opt.top_p, "the top-p arm's mass")->capture_default_str();
  add_finetune_options(uf, unif_opt.finetune_steps, unif_opt.finetune_lr);
  uf->callback([] { write_results(unif_repro(unif_args, unif_opt)); });

  auto* um = repro->add_subcommand(
      "umoe",
      "UMoE in miniature: pretrain a vanilla MoE LM on the mixed corpus, then per seed fine-tune on one domain "
      "directly, after UMoE's surgery and after the one-sided ablation; domain losses, curves, post-hoc pruning");
  static ReproArgs umoe_args{"configs/repro/umoe.toml", "docs/repro/umoe", {}, 3};
  static UMoEReproOptions umoe_opt;
  add_repro_options(um, umoe_args);
  um->add_option("--domain", umoe_opt.domain, "target domain")
      ->capture_default_str()
      ->check(CLI::IsMember({"dictionary", "scripture", "technical", "quotations"}));
  add_finetune_options(um, umoe_opt.finetune_steps, umoe_opt.finetune_lr);
  um->add_option("--calib-samples", umoe_opt.calib_samples, "calibration windows")->capture_default_str();
  um->add_option("--prune", umoe_opt.prune, "fraction pruned and refilled per layer")->capture_default_str();
  um->add_option("--sigma", umoe_opt.sigma, "perturbation scale")->capture_default_str();
  um->callback([] { write_results(umoe_repro(umoe_args, umoe_opt)); });

  auto* ib = repro->add_subcommand(
      "intb",
      "IntBMoE in miniature on the LM corpus: vs dense, top-2 MoE and SMEAR at matched total parameters, the six "
      "ablations, the removal probe and recipe similarity of the trained model, the cache's cost over E");
  static ReproArgs intb_args{"configs/repro/intb.toml", "docs/repro/intb", {}, 3};
  static IntBReproOptions intb_opt;
  add_repro_options(ib, intb_args);
  ib->add_flag("!--no-ablations", intb_opt.ablations, "skip the six ablation arms");
  ib->callback([] { write_results(intb_repro(intb_args, intb_opt)); });
}

}  // namespace mf::cli
