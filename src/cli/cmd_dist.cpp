// `moeforge launch`: flags only; the launcher is src/dist/launch.*.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "core/util.h"
#include "dist/launch.h"

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

}  // namespace mf::cli
