// The training loop: AdamW + warmup/cosine, clipping, accumulation, periodic evaluation,
// JSONL metrics, atomic checkpoints and exact resume.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"
#include "model/transformer.h"

namespace mf {

class DataParallel;

// What dist/ did to the model before the first step.
struct Distributed {
  std::string description;  // environment.json's "parallel", e.g. "expert parallel: 2 MoE layers, ..."
  // Parameters each rank now holds a slice of (expert parallelism's memory sharding): rank r
  // keeps rows [r·n, (r+1)·n) of dim 0 of the whole, n = its size(0). Their gradients are
  // complete on their rank (not summed over ranks); the gradient norm sums them over ranks,
  // checkpoints gather them whole, and every rank evaluates together.
  std::vector<at::Tensor> sharded;
};

struct TrainOptions {
  std::string resume;         // checkpoint or run directory; "" = fresh run
  std::string init_from;      // fresh run whose weights start from this checkpoint (e.g. an upcycled one)
  bool overwrite = false;     // replace an existing run directory
  int64_t stop_after = -1;    // stop (with a checkpoint) after this many steps of this invocation
  int64_t profile_steps = 0;  // profile this many steps after a short warm-up (train/profile.h); 0 = off
  // Data parallel (dist/ implements it over c10d); null = one process. Rank 0 writes the run.
  DataParallel* parallel = nullptr;
  // Called once the model is built (and resumed) and the same on every rank, before the first
  // step: dist/ routes the MoE slots through expert parallelism here and shards their experts.
  std::function<Distributed(const std::vector<std::shared_ptr<FeedForward>>& ffns)> distribute;
  // Text shown and stored in summary.json after training (the CLI samples from the model).
  std::function<std::string(TransformerLM& model, const std::string& tokenizer_path)> sample;
};

struct TrainResult {
  std::string run_dir;
  nlohmann::json summary;
};

TrainResult train(const Config& cfg, const TrainOptions& opt);

}  // namespace mf
