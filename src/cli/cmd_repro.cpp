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
#include "train/repro_report.h"

namespace mf::cli {
namespace {

void add_repro_options(CLI::App* cmd, ReproArgs& a) {
  cmd->add_option("--config", a.config, "base config")->check(CLI::ExistingFile);
  cmd->add_option("--out", a.out, "where results.md, results.json and the SVGs go");
  cmd->add_option("--seeds", a.seeds, "seeds per arm (train.seed = 1000 + s)")->check(CLI::Range(1, 20));
  cmd->add_flag("--quick", a.quick, "smoke run: a tiny model, 10 steps, one seed");
  cmd->add_option("--set", a.sets, "override a key of the base config (repeatable)")->type_name("KEY=VALUE");
}

// The drivers whose results.md is rendered from results.json: --report-only renders it again,
// --lr-sweep trains the reference arm at each learning rate first and records the sweep, --part
// shares the training among processes (these drivers hand their runs to share_training first).
void add_rendered_options(CLI::App* cmd, ReproArgs& a, bool& report_only) {
  add_repro_options(cmd, a);
  cmd->add_flag("--report-only", report_only,
                "train nothing: render results.md (and the pictures) again from --out's results.json");
  cmd->add_option("--lr-sweep", a.lr_sweep, "peak learning rates to try on the reference arm, seed 0, first")
      ->delimiter(',')
      ->type_name("LR,LR,...");
  cmd->add_option("--part", a.part,
                  "share the training among N processes started with --part 1/N ... N/N (same other flags): each "
                  "trains every N-th run and waits for the rest; each then writes the same results")
      ->type_name("I/N");
}

template <class Collect>
void run_rendered(const ReproArgs& a, bool report_only, Collect collect) {
  if (report_only) {
    rerender_results(a.out);
    std::cout << "rendered " << (std::filesystem::path(a.out) / "results.md").string() << " from results.json\n";
    return;
  }
  write_results_files(collect(), a.out);
  std::cout << read_file((std::filesystem::path(a.out) / "results.md").string()) << "\nwrote "
            << (std::filesystem::path(a.out) / "results.md").string() << "\n";
}

void add_finetune_options(CLI::App* cmd, int64_t& steps, double& lr) {
  cmd->add_option("--finetune-steps", steps, "fine-tuning steps per arm")->capture_default_str();
  cmd->add_option("--finetune-lr", lr, "fine-tuning peak learning rate")->capture_default_str();
}

void add_unipool_repro(CLI::App* repro) {
  auto* up = repro->add_subcommand(
      "unipool",
      "UniPool ablation in miniature: vanilla MoE, vanilla x a learnable gate scale, the shared pool with pool aux x "
      "gate scale, full UniPool and UniPool with half the pool (--all-arms: per-layer aux, unscaled softmax, sigmoid, "
      "NormRouter alone, G = 2); paired t intervals, heatmaps and the routing probe under --out");
  static ReproArgs args{"configs/repro/unipool.toml", "docs/repro/unipool", {}, 5};
  static UniPoolReproOptions opt;
  static bool report_only = false;
  add_rendered_options(up, args, report_only);
  up->add_flag("--all-arms", opt.all_arms, "also the five secondary ablation arms");
  up->add_flag("!--no-probe", opt.probe, "skip the routing-randomization probe");
  up->callback([] { run_rendered(args, report_only, [] { return unipool_repro(args, opt); }); });
}

void add_latent_repro(CLI::App* repro) {
  auto* lt = repro->add_subcommand(
      "latent",
      "LatentMoE in miniature: shape sweep at fixed l*m without a shared expert (U shape: quadratic coefficient in "
      "log2(l/m)) and, where the proxy's TwoNN profile has a split, the two-segment allocation vs uniform, swapped, "
      "reversed and moved boundaries, cost-matched");
  static ReproArgs args{"configs/repro/latent.toml", "docs/repro/latent", {}, 5};
  static LatentReproOptions opt;
  static bool report_only = false;
  add_rendered_options(lt, args, report_only);
  lt->add_option("--multiple", opt.multiple, "rounding multiple of the solver")->check(CLI::PositiveNumber);
  lt->add_option("--latents", opt.latents, "the sweep's latent widths l (m = l*m / l)")
      ->delimiter(',')
      ->type_name("L,L,...");
  lt->add_option("--sweep-layers", opt.sweep_layers, "model.n_layers of the shape sweep (default: the config's)");
  lt->callback([] { run_rendered(args, report_only, [] { return latent_repro(args, opt); }); });
}

void add_unif_repro(CLI::App* repro) {
  auto* uf = repro->add_subcommand(
      "unif",
      "UniF-MoE in miniature: pretrain a dense LM without --domain (or a ViT without --classes), upcycle two blocks "
      "into top-2, top-1, top-p and UniF-MoE (and its three ablations), fine-tune each and a dense control "
      "identically per seed on --domain (--classes) alone; quality, activated blocks, and the slots re-timed in "
      "interleaved rounds");
  static ReproArgs args{"configs/repro/unif-lm.toml", "docs/repro/unif-lm", {}, 5};
  static UniFReproOptions opt;
  static bool report_only = false;
  add_rendered_options(uf, args, report_only);
  uf->add_option("--layers", opt.layers, "blocks to upcycle")->capture_default_str();
  uf->add_option("--experts", opt.experts, "experts K per upcycled block")->capture_default_str();
  uf->add_option("--blocks", opt.blocks, "UniF-MoE blocks B per expert")->capture_default_str();
  uf->add_option("--top-p", opt.top_p, "the top-p arm's mass")->capture_default_str();
  uf->add_option("--domain", opt.domain, "LM: the fine-tuning domain, left out of the pretraining")
      ->capture_default_str()
      ->check(CLI::IsMember({"dictionary", "scripture", "technical", "quotations"}));
  uf->add_option("--classes", opt.classes, "ViT: the fine-tuning classes (data.classes), left out of the pretraining")
      ->capture_default_str();
  add_finetune_options(uf, opt.finetune_steps, opt.finetune_lr);
  uf->add_option("--secondary-seeds", opt.secondary_seeds,
                 "seeds of top-1, top-p and the ablations (dense, top-2 and UniF-MoE: --seeds)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  uf->add_option("--timing-rounds", opt.timing_rounds, "interleaved re-timing rounds per seed")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  uf->callback([] { run_rendered(args, report_only, [] { return unif_repro(args, opt); }); });
}

void add_umoe_repro(CLI::App* repro) {
  auto* um = repro->add_subcommand(
      "umoe",
      "UMoE in miniature: pretrain a fine-grained vanilla MoE LM on the mixed corpus (its experts' domain "
      "specialisation measured), then per seed fine-tune on one domain directly, after UMoE's surgery and after the "
      "one-sided ablation; held-out losses at four points, curves, the low-saliency half's share and pruning cost");
  static ReproArgs args{"configs/repro/umoe.toml", "docs/repro/umoe", {}, 5};
  static UMoEReproOptions opt;
  static bool report_only = false;
  add_rendered_options(um, args, report_only);
  um->add_option("--domain", opt.domain, "target domain")
      ->capture_default_str()
      ->check(CLI::IsMember({"dictionary", "scripture", "technical", "quotations"}));
  add_finetune_options(um, opt.finetune_steps, opt.finetune_lr);
  um->add_option("--calib-samples", opt.calib_samples, "calibration windows")->capture_default_str();
  um->add_option("--prune", opt.prune, "fraction pruned and refilled per layer")->capture_default_str();
  um->add_option("--sigma", opt.sigma, "perturbation scale")->capture_default_str();
  um->callback([] { run_rendered(args, report_only, [] { return umoe_repro(args, opt); }); });
}

void add_intb_repro(CLI::App* repro) {
  auto* ib = repro->add_subcommand(
      "intb",
      "IntBMoE in miniature (the LM corpus, or a ViT base config on Fashion-MNIST): vs the dense backbone, top-2 "
      "MoE and SMEAR with E + 1 FFN-sized experts (the paper's matching) and at equal total parameters, the six "
      "ablations, the removal probe over seeds, the cache's cost over E");
  static ReproArgs args{"configs/repro/intb.toml", "docs/repro/intb", {}, 5};
  static IntBReproOptions opt;
  static bool report_only = false;
  add_rendered_options(ib, args, report_only);
  ib->add_flag("!--no-ablations", opt.ablations, "skip the six ablation arms");
  ib->add_option("--secondary-seeds", opt.secondary_seeds, "seeds of every arm but IntBMoE and top-2 (those: --seeds)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  ib->add_option("--probe-seeds", opt.probe_seeds, "IntBMoE seeds whose trained model the removal probe measures")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  ib->callback([] { run_rendered(args, report_only, [] { return intb_repro(args, opt); }); });
}

}  // namespace

void register_repro_commands(CLI::App& app) {
  auto* repro = app.add_subcommand("repro", "miniature reproductions of the papers' experiments");
  repro->require_subcommand(1);
  add_unipool_repro(repro);
  add_latent_repro(repro);
  add_unif_repro(repro);
  add_umoe_repro(repro);
  add_intb_repro(repro);
}

}  // namespace mf::cli
