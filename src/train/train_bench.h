// `moeforge bench train`: training throughput of a config's model, measured by the trainer
// itself (real batches, the real optimizer step), in model FLOPs against the sgemm ceiling
// measured in the same run.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/table.h"

namespace mf {

struct TrainBenchResult {
  std::string run_dir;
  Config config;               // as the run resolved it (model.vocab_size from the corpus)
  double tokens_per_s = 0;     // over the timed steps, after as many warm-up steps (a ViT's: patches + class token)
  double flops_per_token = 0;  // 6 x (active parameters - an LM's embedding table) + attention
  double model_gflops = 0;     // flops_per_token x tokens_per_s
  double sgemm_gflops = 0;     // 2048^3 float32 product, same process
  int64_t parameters_active = 0;
};

// Runs `warmup + steps` steps of cfg (no evaluation) as run `bench-train-<run.name>`.
TrainBenchResult bench_train(Config cfg, int64_t steps, int64_t warmup);

// r beside the same model and step in PyTorch (`peer`, bench/peers/train_step.py; "" skips it) in
// the default and the tuned environment: the table, its JSON (with the run's figures) and a
// line saying what was measured.
struct TrainBenchReport {
  ResultTable table;
  nlohmann::json json;
  std::string note;
};
TrainBenchReport train_bench_report(const TrainBenchResult& r, const std::string& config_path, const std::string& peer,
                                    int64_t steps, int64_t warmup);

// 6 N + 6 L T d: forward and backward of every active non-embedding parameter (the LM head
// included), plus the causal attention scores and mixing (half of 12 L T d). A classifier
// (model.task = "classify"): N counts every active parameter (the patch embedding is a
// product) and its attention is bidirectional, 12 L T d.
double train_flops_per_token(const ModelConfig& m, int64_t seq_len, int64_t active_parameters);

// tokens an item brings: an LM window's train.seq_len, an image's patches + the class token
int64_t tokens_per_item(const Config& c);

}  // namespace mf
