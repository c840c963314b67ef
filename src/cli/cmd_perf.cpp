// `moeforge bench train | generate | serve | kernels`: the performance benchmarks beside their
// baselines (the sgemm ceiling, the bandwidth bound, PyTorch peers, LibTorch compositions).
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/peer.h"
#include "core/runtime.h"
#include "core/util.h"
#include "serve/generate_bench.h"
#include "serve/serve_bench.h"
#include "train/kernel_cases.h"
#include "train/train_bench.h"

namespace mf::cli {

void add_performance_benches(CLI::App* bench) {
  auto* tr = bench->add_subcommand(
      "train",
      "training throughput of a config's model through the trainer (real batches and optimizer step), in model "
      "FLOPs against the sgemm ceiling, and the same model and step in PyTorch (python3-torch), default and tuned "
      "environment");
  static std::string train_config = "configs/quickstart.toml", train_peer = "bench/peers/train_step.py", train_json;
  static int64_t train_steps = 20, train_warmup = 10;
  tr->add_option("config", train_config, "TOML config (an LM with a SwiGLU MoE FFN for the peer)")
      ->capture_default_str();
  tr->add_option("--steps", train_steps, "timed steps")->capture_default_str()->check(CLI::PositiveNumber);
  tr->add_option("--warmup", train_warmup, "untimed steps first")->capture_default_str()->check(CLI::PositiveNumber);
  tr->add_option("--peer", train_peer, "Python peer script ('' to skip)")->capture_default_str();
  tr->add_option("--json", train_json, "also write the results as JSON");
  tr->callback([] {
    auto cfg = load_config(train_config);
    set_compute_threads(static_cast<int>(worker_threads(cfg.train.threads)));
    const auto r = bench_train(cfg, train_steps, train_warmup);
    const auto& m = r.config.model;
    const auto args = fmt::format(
        "--d {} --layers {} --heads {} --kv-heads {} --experts {} --top-k {} --expert-hidden {} --vocab {} "
        "--batch {} --seq {} --steps {} --warmup {} --threads {} --lr {} --weight-decay {}",
        m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.moe.num_experts, m.moe.top_k, m.moe.expert_hidden,
        m.vocab_size, cfg.train.batch_size, cfg.train.seq_len, train_steps, train_warmup, cfg.train.threads,
        cfg.train.lr, cfg.train.weight_decay);
    nlohmann::json js = {{"config", train_config},
                         {"sgemm_gflops", r.sgemm_gflops},
                         {"flops_per_token", r.flops_per_token},
                         {"moeforge", {{"tokens_per_s", r.tokens_per_s}, {"model_gflops", r.model_gflops}}}};
    std::cout << fmt::format("{:<34} {:>10} {:>14} {:>10} {:>10}\n", "implementation", "tokens/s", "model GFLOP/s",
                             "vs sgemm", "ours vs");
    auto row = [&](const std::string& name, double tps) {
      const double gf = r.flops_per_token * tps / 1e9;
      std::cout << fmt::format("{:<34} {:>10.0f} {:>14.1f} {:>9.2f}x {:>9.2f}x\n", name, tps, gf, gf / r.sgemm_gflops,
                               r.tokens_per_s / tps);
    };
    row("moeforge train", r.tokens_per_s);
    const bool moe_peer = cfg.model.ffn == "moe" && cfg.model.task != "classify" && !train_peer.empty();
    for (bool default_env : {false, true}) {
      const std::string name = default_env ? "PyTorch (default environment)" : "PyTorch (OMP_WAIT_POLICY=PASSIVE)";
      auto res = moe_peer ? run_peer(train_peer, args, default_env)
                          : nlohmann::json{{"skipped", train_peer.empty() ? "--peer ''" : "the peer is an MoE LM"}};
      js[default_env ? "pytorch_default" : "pytorch_tuned"] = res;
      if (res.contains("tokens_per_s"))
        row(name, res["tokens_per_s"].get<double>());
      else
        std::cout << fmt::format("{:<34} {}\n", name, res["skipped"].get<std::string>());
    }
    std::cout << fmt::format(
        "{}: {:.1f} MFLOP per token (6 x {:.2f} M active non-embedding parameters + attention), {} tokens per "
        "{}, sgemm {:.1f} GFLOP/s, {} threads, {} timed steps after {}\n",
        train_config, r.flops_per_token / 1e6,
        (r.parameters_active - (m.task == "classify" ? 0 : m.vocab_size * m.d_model)) / 1e6, tokens_per_item(cfg),
        m.task == "classify" ? "image" : "window", r.sgemm_gflops, cfg.train.threads, train_steps, train_warmup);
    if (!train_json.empty()) write_file_atomic(train_json, js.dump(2) + "\n");
  });

  auto* gen = bench->add_subcommand(
      "generate",
      "greedy decoding with the KV cache at batch 1 and 8 against the memory-bandwidth bound and the same model "
      "decoded in PyTorch (python3-torch)");
  const auto gen_t = std::make_shared<Timing>();
  static std::string gen_source = "configs/quickstart.toml", gen_peer = "bench/peers/generate.py", gen_json;
  static int64_t gen_prompt = 16, gen_tokens = 128;
  gen->add_option("source", gen_source, "a TOML config (random weights of that shape) or a checkpoint")
      ->capture_default_str();
  gen->add_option("--prompt", gen_prompt, "prompt tokens")->capture_default_str()->check(CLI::PositiveNumber);
  gen->add_option("--tokens", gen_tokens, "new tokens per row")->capture_default_str()->check(CLI::PositiveNumber);
  gen->add_option("--threads", gen_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  gen->add_option("--peer", gen_peer, "Python peer script ('' to skip)")->capture_default_str();
  gen->add_option("--json", gen_json, "also write the results as JSON");
  gen->callback([gen_t] {
    set_compute_threads(gen_t->threads);
    const auto r = bench_generate(gen_source, gen_prompt, gen_tokens, {1, 8});
    const auto& m = r.config.model;
    nlohmann::json peer = nlohmann::json{{"skipped", "--peer ''"}};
    if (!gen_peer.empty() && m.ffn == "moe")
      peer = run_peer(gen_peer,
                      fmt::format("--d {} --layers {} --heads {} --kv-heads {} --experts {} --top-k {} "
                                  "--expert-hidden {} --vocab {} --prompt {} --new-tokens {} --threads {}",
                                  m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.moe.num_experts, m.moe.top_k,
                                  m.moe.expert_hidden, m.vocab_size, gen_prompt, gen_tokens, gen_t->threads),
                      false);
    nlohmann::json js = {{"source", gen_source},
                         {"weight_bytes_per_step", r.weight_bytes_per_step},
                         {"bandwidth_gbs", r.bandwidth_gbs},
                         {"bound_tokens_per_s", r.bound_tokens_per_s},
                         {"pytorch", peer}};
    std::cout << fmt::format("{:<6} {:>16} {:>18} {:>14}\n", "batch", "ours tokens/s", "PyTorch tokens/s",
                             "ours vs PyTorch");
    for (const auto& row : r.rows) {
      const auto key = fmt::format("batch{}_tokens_per_s", row.batch);
      const double theirs = peer.contains(key) ? peer[key].get<double>() : 0;
      std::cout << fmt::format("{:<6} {:>16.1f} {:>18} {:>14}\n", row.batch, row.tokens_per_s,
                               theirs > 0 ? fmt::format("{:.1f}", theirs) : "-",
                               theirs > 0 ? fmt::format("{:.2f}x", row.tokens_per_s / theirs) : "-");
      js["moeforge"][key] = row.tokens_per_s;
    }
    if (!r.units_path.empty()) std::cout << "experts ran on the " << r.units_path << " units path\n";
    js["units_path"] = r.units_path;
    if (!peer.contains("torch")) std::cout << "PyTorch: " << peer.value("skipped", "") << "\n";
    std::cout << fmt::format(
        "bandwidth bound at batch 1: {:.1f} MB of active weights per step at {:.1f} GB/s = {:.0f} tokens/s; "
        "{} prompt + {} new tokens, greedy, {} threads\n",
        r.weight_bytes_per_step / 1e6, r.bandwidth_gbs, r.bound_tokens_per_s, gen_prompt, gen_tokens, gen_t->threads);
    if (!gen_json.empty()) write_file_atomic(gen_json, js.dump(2) + "\n");
  });

  auto* sv = bench->add_subcommand(
      "serve", "the HTTP server under concurrent clients on loopback: tokens/s, latency p50/p95, rows per step");
  const auto sv_t = std::make_shared<Timing>();
  static std::string serve_source = "configs/quickstart.toml", serve_json;
  static std::vector<int64_t> serve_clients = {1, 4, 16};
  static int64_t serve_requests = 4, serve_tokens = 32;
  sv->add_option("source", serve_source, "a TOML config (random weights of that shape) or a checkpoint")
      ->capture_default_str();
  sv->add_option("--clients", serve_clients, "concurrent clients, one round each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sv->add_option("--requests", serve_requests, "requests per client, one after another")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sv->add_option("--tokens", serve_tokens, "max_tokens per request")->capture_default_str()->check(CLI::PositiveNumber);
  sv->add_option("--threads", sv_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  sv->add_option("--json", serve_json, "also write the results as JSON");
  sv->callback([sv_t] {
    set_compute_threads(sv_t->threads);
    const auto table = serve_bench_table(bench_serve(serve_source, serve_clients, serve_requests, serve_tokens));
    std::cout << table.text();
    std::cout << fmt::format("{} on loopback, {} threads, temperature 0.8, {} tokens per request\n", serve_source,
                             sv_t->threads, serve_tokens);
    if (!serve_json.empty()) write_file_atomic(serve_json, table.json().dump(2) + "\n");
  });

  auto* kernels = bench->add_subcommand(
      "kernels",
      "each case of the kernel table (train/kernel_cases.cpp) vs the LibTorch composition it replaces: time, "
      "speed-up, GFLOP/s and relative error, float32");
  const auto kernels_t = std::make_shared<Timing>();
  static std::string kernels_json;
  kernels->add_option("--iters", kernels_t->iters, "timed iterations (best is reported)")->check(CLI::PositiveNumber);
  kernels->add_option("--threads", kernels_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  kernels->add_option("--json", kernels_json, "also write the results as JSON");
  kernels->callback([kernels_t] {
    set_compute_threads(kernels_t->threads);
    const auto table = bench_kernels(kernels_t->iters);
    std::cout << table.text()
              << fmt::format(
                     "float32, {} threads, best of {}; the cases are train/kernel_cases.cpp's table (the tests "
                     "run it too); rel. err: max |ours - LibTorch| / max |LibTorch|\n",
                     kernels_t->threads, kernels_t->iters);
    if (!kernels_json.empty()) write_file_atomic(kernels_json, table.json().dump(2) + "\n");
  });
}

}  // namespace mf::cli
