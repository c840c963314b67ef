// Each file registers its subcommands on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "io/model_io.h"

namespace mf::cli {

// A benchmark's timing options, one instance per subcommand.
struct Timing {
  int iters = 3, threads = 2;
};

void register_data_commands(CLI::App& app);      // data prepare, doctor
void register_train_commands(CLI::App& app);     // train, plot, config, report
void register_model_commands(CLI::App& app);     // eval, generate, info, upcycle
void register_bench_commands(CLI::App& app);     // bench moe, unif, intb, tokenizer, loss
void add_performance_benches(CLI::App* bench);   // bench train, generate, serve, kernels (cmd_perf.cpp)
void add_comm_bench(CLI::App* bench);            // bench comm (cmd_dist.cpp)
void register_analysis_commands(CLI::App& app);  // usage, probe, diagnose, intb-probe, intb-bake
void register_repro_commands(CLI::App& app);     // repro unipool, latent, unif, umoe, intb
void register_latent_commands(CLI::App& app);    // shape (cost, square, scale, solve), id, jacobian
void register_umoe_commands(CLI::App& app);      // saliency, umoe
void register_layer_commands(CLI::App& app);     // layer names, layer run
void register_hf_commands(CLI::App& app);        // import, export, tokenize (Hugging Face)
void register_serve_commands(CLI::App& app);     // serve (HTTP)
void register_dist_commands(CLI::App& app);      // launch (data parallel)

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets);
// --dtype f32|bf16: the dtype a command that only runs a model holds its weights in (model/weight_dtype.h)
void add_weight_dtype_option(CLI::App* cmd, std::string& dtype, bool int8 = false);  // int8: generate, eval, serve

}  // namespace mf::cli
