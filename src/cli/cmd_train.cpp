#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <iostream>

#include "analysis/report.h"
#include "analysis/svg_plot.h"
#include "cli/commands.h"
#include "dist/train_group.h"
#include "serve/generate.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace mf::cli {
namespace {

void print_summary(const TrainResult& r) {
  const auto& s = r.summary;
  const bool images = s.value("task", "lm") == "classify";
  const std::string items = images ? "images" : "tokens";
  std::cout << fmt::format("\n== {} ==  steps {}  params {:.2f}M  {} {:.2f}M  {:.0f} {}/s  {:.0f} s\n",
                           s["run"].get<std::string>(), s["steps"].get<int64_t>(), s["parameters"].get<int64_t>() / 1e6,
                           items, s[items + "_seen"].get<int64_t>() / 1e6, s[items + "_per_s"].get<double>(), items,
                           s["elapsed_s"].get<double>());
  if (images) {
    std::cout << fmt::format("validation: loss {:.4f}  accuracy {:.2f} %\n", s["val_loss_mean"].get<double>(),
                             100 * s.value("val_accuracy", 0.0));
  } else {
    std::cout << fmt::format("{:<12} {:>9} {:>11}\n", "domain", "val loss", "perplexity");
    for (auto& [dom, loss] : s["val_loss"].items())
      std::cout << fmt::format("{:<12} {:>9.4f} {:>11.2f}\n", dom, loss.get<double>(), std::exp(loss.get<double>()));
    std::cout << fmt::format("{:<12} {:>9.4f}   (unigram entropy of the corpus: {:.4f} nats)\n", "mean",
                             s["val_loss_mean"].get<double>(), s.value("unigram_entropy_nats", 0.0));
    std::cout << "sample: " << s["sample"].get<std::string>() << "\n";
  }
  std::cout << "run directory: " << r.run_dir << "  (metrics.jsonl, summary.json, loss.svg, checkpoints/)\n";
}

void add_train(CLI::App& app) {
  static RunSource source;
  static TrainOptions opt;
  static bool expert_parallel = false;
  auto* tr = app.add_subcommand("train",
                                "train a language model from a TOML config; writes runs/NAME/ with "
                                "config.toml, metrics.jsonl, checkpoints/ and summary.json");
  tr->add_option("config", source.config, "TOML config (e.g. configs/quickstart.toml); optional with --resume")
      ->check(CLI::ExistingFile);
  add_set_option(tr, source.sets);
  tr->add_option("--resume", opt.resume, "continue bit-identically from a checkpoint or a run directory (its latest)");
  tr->add_option("--init-from", opt.init_from,
                 "start a fresh run from this checkpoint's weights (e.g. `moeforge upcycle`'s output); its config is "
                 "used when no config file is given");
  tr->add_flag("--overwrite", opt.overwrite, "delete an existing run directory of the same name first");
  tr->add_option("--stop-after", opt.stop_after, "stop after N steps of this invocation (checkpoint written)");
  tr->add_option("--profile", opt.profile_steps,
                 "profile N steps after a 5-step warm-up: RUN/profile.json (Chrome trace) and RUN/profile.txt "
                 "(operators by self time per step); under `moeforge launch`, rank 0's steps")
      ->check(CLI::PositiveNumber);
  tr->add_flag("--expert-parallel", expert_parallel,
               "with WORLD_SIZE > 1 (moeforge launch, torchrun): each rank computes 1/WORLD_SIZE of every MoE layer's "
               "experts, holding only their weights and optimizer state, and tokens travel to them by all-to-all; "
               "evaluation and sampling then run on every rank together (UniF-MoE and IntBMoE layers stay data "
               "parallel)");
  tr->callback([] {
    source.resume = opt.resume, source.init_from = opt.init_from;
    if (source.config.empty() && source.resume.empty() && source.init_from.empty())
      throw CLI::RequiredError("config (or --resume / --init-from)");
    const Config cfg = run_config(source);
    opt.sample = prompt_sampler(cfg.sample);
    const auto group = join_training_group(opt, expert_parallel);
    auto result = train(cfg, opt);
    if (group && group->rank() > 0) return;
    plot_run_losses(result.run_dir);
    write_report({result.run_dir}, result.run_dir + "/report.html");
    print_summary(result);
  });
}

void add_plot(CLI::App& app) {
  static std::string dir;
  auto* pl = app.add_subcommand("plot", "draw a run's training and per-domain validation loss as RUN_DIR/loss.svg");
  pl->add_option("run_dir", dir, "run directory (holds metrics.jsonl)")->required()->check(CLI::ExistingDirectory);
  pl->callback([] { std::cout << "wrote " << plot_run_losses(dir) << "\n"; });
}

void add_report(CLI::App& app) {
  static std::vector<std::string> runs;
  static std::string out = "report.html", title;
  auto* rp = app.add_subcommand(
      "report",
      "one self-contained HTML page of one run or several overlaid (loss, learning rate, gradient norm, throughput, "
      "per MoE layer balance / usage / aux losses, method panels, the analyses' pictures); works on a run that is "
      "still training");
  rp->add_option("runs", runs, "run directories (hold metrics.jsonl and config.toml)")
      ->required()
      ->check(CLI::ExistingDirectory);
  rp->add_option("-o,--out", out, "the HTML file to write")->capture_default_str();
  rp->add_option("--title", title, "page title (default: the run names)");
  rp->callback([] {
    write_report(runs, out, title);
    std::cout << "wrote " << out << "\n";
  });
}

void add_config(CLI::App& app) {
  static std::string path;
  static std::vector<std::string> sets;
  static bool markdown = false;
  auto* cf = app.add_subcommand("config", "print the resolved config (file + --set) as TOML, or the schema");
  cf->add_option("config", path, "TOML config to resolve (defaults without one)")->check(CLI::ExistingFile);
  add_set_option(cf, sets);
  cf->add_flag("--markdown", markdown, "print the config reference (every key, type, default, range) as Markdown");
  cf->callback([] { std::cout << (markdown ? schema_markdown() : to_toml(resolve_config(path, sets))); });
}

}  // namespace

void register_train_commands(CLI::App& app) {
  add_train(app);
  add_plot(app);
  add_report(app);
  add_config(app);
}

}  // namespace mf::cli
