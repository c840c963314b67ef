// moeforge: the command-line front end of libmoeforge.
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/runtime.h"
#include "core/util.h"
#include "io/safetensors.h"
#include "methods/methods.h"

int main(int argc, char** argv) {
  mf::tune_process_environment(argv);
  mf::tune_allocator();
  mf::use_shared_cores();
  mf::register_builtin_methods();
  CLI::App app{
      "MoEForge: build, train, reshape, probe and serve Mixture-of-Experts transformers.\n"
      "Start with `moeforge data prepare`, then `moeforge train configs/quickstart.toml`."};
  app.set_version_flag("--version", std::string("moeforge ") + MOEFORGE_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  app.require_subcommand(1);
  mf::cli::register_data_commands(app);
  mf::cli::register_train_commands(app);
  mf::cli::register_model_commands(app);
  mf::cli::register_bench_commands(app);
  mf::cli::register_analysis_commands(app);
  mf::cli::register_repro_commands(app);
  mf::cli::register_latent_commands(app);
  mf::cli::register_umoe_commands(app);
  mf::cli::register_layer_commands(app);
  mf::cli::register_hf_commands(app);
  mf::cli::register_serve_commands(app);
  mf::cli::register_dist_commands(app);
  app.parse_complete_callback([&] { mf::setup_logging(verbose); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mf::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return 2;
  } catch (const mf::FormatError& e) {
    spdlog::error("{}", e.what());
    return 3;
  } catch (const c10::Error& e) {  // one line; LibTorch's backtrace only with --verbose
    spdlog::error("{}", e.what_without_backtrace());
    spdlog::debug("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
