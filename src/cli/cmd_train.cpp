#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "analysis/report.h"
#include "analysis/svg_plot.h"
#include "cli/commands.h"
#include "data/tokenizer.h"
#include "dist/expert_parallel.h"
#include "dist/gloo_group.h"
#include "dist/world.h"
#include "io/checkpoint.h"
#include "serve/generate.h"
#include "train/trainer.h"

namespace mf::cli {

static void print_summary(const TrainResult& r) {
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

void register_train_commands(CLI::App& app) {
  auto* tr = app.add_subcommand("train",
                                "train a language model from a TOML config; writes runs/NAME/ with "
                                "config.toml, metrics.jsonl, checkpoints/ and summary.json");
  static std::string cfg_path;
  static std::vector<std::string> sets;
  static TrainOptions opt;
  tr->add_option("config", cfg_path, "TOML config (e.g. configs/quickstart.toml); optional with --resume")
      ->check(CLI::ExistingFile);
  add_set_option(tr, sets);
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
  static bool expert_parallel = false;
  tr->add_flag("--expert-parallel", expert_parallel,
               "with WORLD_SIZE > 1 (moeforge launch, torchrun): each rank computes 1/WORLD_SIZE of every MoE layer's "
               "experts, holding only their weights and optimizer state, and tokens travel to them by all-to-all; "
               "evaluation and sampling then run on every rank together (UniF-MoE and IntBMoE layers stay data "
               "parallel)");
  tr->callback([] {
    Config cfg;
    const auto run_config = std::filesystem::path(opt.resume) / "config.toml";
    if (cfg_path.empty() && !opt.resume.empty() && std::filesystem::is_regular_file(run_config) &&
        latest_checkpoint(opt.resume).empty()) {  // killed before its first checkpoint: its config, from step 0
      cfg = resolve_config(run_config.string(), sets);
    } else if (cfg_path.empty() && (!opt.resume.empty() || !opt.init_from.empty())) {
      cfg = checkpoint_config(opt.resume.empty() ? opt.init_from : opt.resume);
      for (const auto& s : sets) apply_override(cfg, s);
      validate(cfg);
    } else if (cfg_path.empty()) {
      throw CLI::RequiredError("config (or --resume / --init-from)");
    } else {
      cfg = resolve_config(cfg_path, sets);
    }
    opt.sample = [&cfg](TransformerLM& model, const std::string& tokenizer_path) {
      Tokenizer tok(tokenizer_path);
      SamplingOptions so{cfg.sample.max_tokens, cfg.sample.temperature, cfg.sample.top_p,
                         static_cast<uint64_t>(cfg.sample.seed), tok.eos_id()};
      return cfg.sample.prompt + tok.decode(generate(model, tok.encode(cfg.sample.prompt), so));
    };
    // WORLD_SIZE > 1 (moeforge launch, torchrun, srun): data parallel over c10d; rank 0 reports
    std::unique_ptr<DataParallel> group;
    if (auto world = world_from_env()) {
      if (world->rank > 0) spdlog::set_level(spdlog::level::warn);
      group = join_gloo_group(*world);
      opt.parallel = group.get();
      if (expert_parallel)
        opt.distribute = [&group](const std::vector<std::shared_ptr<FeedForward>>& ffns) {
          auto ep = enable_expert_parallel(ffns, *group);
          Distributed d{
              ep.layers == 0
                  ? std::string("expert parallel: no layer to split (UniF-MoE and IntBMoE layers "
                                "route on their own and stay data parallel)")
                  : fmt::format("expert parallel: {} MoE layers, their experts split over {} ranks "
                                "(each keeps 1/{} of their {:.2f}M parameters)",
                                ep.layers, group->world(), group->world(), static_cast<double>(ep.whole) / 1e6),
              std::move(ep.sharded)};
          spdlog::info("{}", d.description);
          return d;
        };
    } else if (expert_parallel) {
      spdlog::warn("--expert-parallel: one process (WORLD_SIZE unset or 1), nothing to split");
    }
    auto result = train(cfg, opt);
    if (group && group->rank() > 0) return;
    plot_run_losses(result.run_dir);
    write_report({result.run_dir}, result.run_dir + "/report.html");
    print_summary(result);
  });

  auto* pl = app.add_subcommand("plot", "draw a run's training and per-domain validation loss as RUN_DIR/loss.svg");
  static std::string plot_dir;
  pl->add_option("run_dir", plot_dir, "run directory (holds metrics.jsonl)")->required()->check(CLI::ExistingDirectory);
  pl->callback([] { std::cout << "wrote " << plot_run_losses(plot_dir) << "\n"; });

  auto* rp = app.add_subcommand(
      "report",
      "one self-contained HTML page of one run or several overlaid (loss, learning rate, gradient norm, throughput, "
      "per MoE layer balance / usage / aux losses, method panels, the analyses' pictures); works on a run that is "
      "still training");
  static std::vector<std::string> report_runs;
  static std::string report_out = "report.html", report_title;
  rp->add_option("runs", report_runs, "run directories (hold metrics.jsonl and config.toml)")
      ->required()
      ->check(CLI::ExistingDirectory);
  rp->add_option("-o,--out", report_out, "the HTML file to write")->capture_default_str();
  rp->add_option("--title", report_title, "page title (default: the run names)");
  rp->callback([] {
    write_report(report_runs, report_out, report_title);
    std::cout << "wrote " << report_out << "\n";
  });

  auto* cf = app.add_subcommand("config", "print the resolved config (file + --set) as TOML, or the schema");
  static std::string show_path;
  static std::vector<std::string> show_sets;
  static bool markdown = false;
  cf->add_option("config", show_path, "TOML config to resolve (defaults without one)")->check(CLI::ExistingFile);
  add_set_option(cf, show_sets);
  cf->add_flag("--markdown", markdown, "print the config reference (every key, type, default, range) as Markdown");
  cf->callback([] {
    if (markdown)
      std::cout << schema_markdown();
    else
      std::cout << to_toml(resolve_config(show_path, show_sets));
  });
}

}  // namespace mf::cli
