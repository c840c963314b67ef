// `moeforge launch`: flags only; the launcher is src/dist/launch.*.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "core/util.h"
#include "dist/comm_bench.h"
#include "dist/expert_parallel.h"
#include "dist/gloo_group.h"
#include "dist/launch.h"
#include "dist/world.h"

namespace mf::cli {

void register_dist_commands(CLI::App& app) {
  auto* ln = app.add_subcommand(
      "launch",
      "start N local workers of a data-parallel run (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set as "
      "torchrun does); when one fails the others are stopped. Example: moeforge launch --nproc 2 train "
      "configs/quickstart.toml --set train.grad_accum=2 --set train.threads=1");
  static LaunchOptions opt;
  static std::string master;
  static std::vector<std::string> command;
  ln->add_option("--nproc", opt.nproc, "workers on this node")->capture_default_str()->check(CLI::Range(1, 1024));
  ln->add_option("--nnodes", opt.nnodes, "nodes in the run")->capture_default_str()->check(CLI::Range(1, 65536));
  ln->add_option("--node-rank", opt.node_rank, "this node's index")->capture_default_str();
  ln->add_option("--master", master, "ADDR:PORT of rank 0's rendezvous (default 127.0.0.1 and a free port)");
  ln->add_option("--grace", opt.grace_seconds, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  // everything from the first argument that is not one of launch's options on is the workers'
  // command (e.g. train CONFIG --set ...)
  ln->prefix_command();
  ln->callback([ln] {
    if (!master.empty()) {
      const auto colon = master.rfind(':');
      if (colon == std::string::npos || colon == 0)
        throw ConfigError(fmt::format("--master '{}' must be ADDR:PORT", master));
      opt.master_addr = master.substr(0, colon);
      opt.master_port = static_cast<int>(parse_int(master.substr(colon + 1), "--master port"));
    }
    command = ln->remaining();
    if (command.empty()) throw CLI::RequiredError("the workers' command (e.g. train CONFIG)");
    const int code = launch(opt, command);
    if (code != 0) std::exit(code);
  });
}

void add_comm_bench(CLI::App* bench) {
  auto* cm = bench->add_subcommand(
      "comm",
      "under `moeforge launch --nproc N`: checks an all-to-all with unequal splits and an expert-parallel MoE "
      "layer against one process (float64, outputs and gradients), times all-reduces and the MoE "
      "dispatch all-to-all, and projects expert-parallel traffic for a 64-expert model over 8 and 64 ranks");
  static CommBenchOptions opt;
  cm->add_option("--tokens", opt.tokens, "tokens per rank")->capture_default_str()->check(CLI::PositiveNumber);
  cm->add_option("--d", opt.d, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  cm->add_option("--top-k", opt.top_k, "experts per token")->capture_default_str()->check(CLI::PositiveNumber);
  cm->add_option("--iters", opt.iters, "timed repetitions (best is reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cm->callback([] {
    auto world = world_from_env();
    if (!world) throw ConfigError("bench comm needs a group: run it as `moeforge launch --nproc 2 bench comm`");
    auto group = join_gloo_group(*world);
    const auto rows = bench_comm(*group, opt);
    const double ep_diff = check_expert_parallel(*group);
    if (group->rank() != 0) return;
    std::cout << fmt::format("all-to-all check passed ({} ranks, unequal splits)\n", group->world());
    std::cout << fmt::format(
        "expert-parallel check passed: one MoE layer, float64, output and gradients equal one process's within "
        "{:.2g}\n",
        ep_diff);
    std::cout << fmt::format("{:<44} {:>12} {:>10} {:>10}\n", "collective", "MB sent", "ms", "GB/s");
    for (const auto& r : rows)
      std::cout << fmt::format("{:<44} {:>12.2f} {:>10.2f} {:>10.2f}\n", r.what, r.bytes / 1e6, 1e3 * r.seconds, r.gbs);
    // A model, not a claim: the measured all-to-all rate applied to paper-scale shapes.
    const double gbs = rows.back().gbs;
    std::cout << fmt::format(
        "\nprojection at this machine's all-to-all rate ({:.2f} GB/s per rank; a real network differs), 64 experts, "
        "top-8, d = 2048, 4096 tokens per rank, per MoE layer and step (dispatch + combine, forward + backward):\n",
        gbs);
    for (int64_t ranks : {8, 64}) {
      const double bytes = expert_parallel_bytes(4096, 2048, 8, ranks);
      const double seconds = bytes / (gbs * 1e9);
      std::cout << fmt::format(
          "  {:>2} ranks: {:.0f} MB per rank, {:.1f} ms, at most {:.0f} tokens/s per rank per MoE "
          "layer from communication alone\n",
          ranks, bytes / 1e6, 1e3 * seconds, 4096 / seconds);
    }
  });
}

}  // namespace mf::cli
