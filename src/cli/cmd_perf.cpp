// `moeforge bench train | generate | serve | kernels`: the performance benchmarks beside their
// baselines (the sgemm ceiling, the bandwidth bound, PyTorch peers, LibTorch compositions).
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "cli/commands.h"
#include "core/runtime.h"
#include "core/util.h"
#include "serve/generate_bench.h"
#include "serve/serve_bench.h"
#include "train/kernel_cases.h"
#include "train/train_bench.h"

namespace mf::cli {
namespace {

void add_train_bench(CLI::App* bench) {
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
    const auto report = train_bench_report(bench_train(cfg, train_steps, train_warmup), train_config, train_peer,
                                           train_steps, train_warmup);
    std::cout << report.table.text() << report.note;
    if (!train_json.empty()) write_file_atomic(train_json, report.json.dump(2) + "\n");
  });
}

void add_generate_bench(CLI::App* bench) {
  auto* gen = bench->add_subcommand(
      "generate",
      "greedy decoding with the KV cache at batch 1 and 8 against the memory-bandwidth bound (active weight bytes "
      "per step over the streaming-read bandwidth that doctor prints, batch 1 in 3 rounds, each decode between two "
      "reads) and the same model "
      "decoded in PyTorch (python3-torch) and in llama.cpp (GGUF f32 / f16 / q8_0 through node-llama-cpp)");
  const auto gen_t = std::make_shared<Timing>();
  static std::string gen_source = "configs/quickstart.toml", gen_peer = "bench/peers/generate.py",
                     gen_llama = "tests/llama/llama_peer.mjs", gen_json;
  static int64_t gen_prompt = 16, gen_tokens = 128;
  static std::vector<std::string> gen_weights = {"f32", "bf16"};
  static std::vector<int64_t> gen_prefill;
  gen->add_option("source", gen_source, "a TOML config (random weights of that shape) or a checkpoint")
      ->capture_default_str();
  gen->add_option("--prompt", gen_prompt, "prompt tokens")->capture_default_str()->check(CLI::PositiveNumber);
  gen->add_option("--tokens", gen_tokens, "new tokens per row")->capture_default_str()->check(CLI::PositiveNumber);
  gen->add_option("--threads", gen_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  gen->add_option("--peer", gen_peer, "Python peer script ('' to skip)")->capture_default_str();
  gen->add_option("--llama", gen_llama,
                  "llama.cpp peer (node-llama-cpp; the model exported to GGUF f32, f16 and q8_0, batch 1; '' to skip)")
      ->capture_default_str();
  gen->add_option("--json", gen_json, "also write the results as JSON");
  gen->add_option("--dtype", gen_weights, "the dtypes our weights are held in, each timed (f32, bf16, int8)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  gen->add_option("--prefill", gen_prefill,
                  "also time prompt processing at batch 1 for prompts of these lengths (e.g. 128 512), ours and "
                  "llama.cpp's")
      ->check(CLI::PositiveNumber);
  gen->callback([gen_t] {
    set_compute_threads(gen_t->threads);
    const auto report =
        generate_bench_report(bench_generate(gen_source, gen_prompt, gen_tokens, {1, 8}, gen_weights, gen_prefill),
                              gen_source, gen_peer, gen_llama, gen_prompt, gen_tokens, gen_t->threads, gen_prefill);
    std::cout << report.table.text();
    if (!gen_prefill.empty()) std::cout << "\n" << report.prefill.text();
    std::cout << report.note;
    if (!gen_json.empty()) write_file_atomic(gen_json, report.json.dump(2) + "\n");
  });
}

void add_serve_bench(CLI::App* bench) {
  auto* sv = bench->add_subcommand(
      "serve", "the HTTP server under concurrent clients on loopback: tokens/s, latency p50/p95, rows per step");
  const auto sv_t = std::make_shared<Timing>();
  static std::string serve_source = "configs/quickstart.toml", serve_json;
  static std::vector<int64_t> serve_clients = {1, 4, 16};
  static int64_t serve_requests = 4, serve_tokens = 32;
  static double serve_arrivals = 2;
  static std::vector<std::string> serve_batching = {"continuous", "static"};
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
  sv->add_option("--arrivals-s", serve_arrivals,
                 "each client's first request waits a delay drawn uniformly below this (seeded; 0: all at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600.0));
  sv->add_option("--batching", serve_batching, "the server's batching, each timed (continuous, static)")
      ->capture_default_str()
      ->check(CLI::IsMember({"continuous", "static"}));
  sv->add_option("--threads", sv_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  sv->add_option("--json", serve_json, "also write the results as JSON");
  sv->callback([sv_t] {
    set_compute_threads(sv_t->threads);
    const auto table = serve_bench_table(
        bench_serve(serve_source, serve_clients, serve_requests, serve_tokens, serve_arrivals, serve_batching));
    std::cout << table.text();
    std::cout << fmt::format(
        "{} on loopback, {} threads, temperature 0.8, {} tokens per request, first requests spread over {} s\n",
        serve_source, sv_t->threads, serve_tokens, serve_arrivals);
    if (!serve_json.empty()) write_file_atomic(serve_json, table.json().dump(2) + "\n");
  });
}

void add_kernels_bench(CLI::App* bench) {
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

}  // namespace

void add_performance_benches(CLI::App* bench) {
  add_train_bench(bench);
  add_generate_bench(bench);
  add_serve_bench(bench);
  add_kernels_bench(bench);
}

}  // namespace mf::cli
