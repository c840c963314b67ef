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

struct TrainOptions {
  std::string resume;         // checkpoint or run directory; "" = fresh run
  std::string init_from;      // fresh run whose weights start from this checkpoint (e.g. an upcycled one)
  bool overwrite = false;     // replace an existing run directory
  int64_t stop_after = -1;    // stop (with a checkpoint) after this many steps of this invocation
  int64_t profile_steps = 0;  // profile this many steps after a short warm-up (train/profile.h); 0 = off
  // Data parallel (dist/ implements it over c10d); null = one process. Rank 0 writes the run.
  DataParallel* parallel = nullptr;
  // Called once the model is built and the same on every rank, before the first step: dist/
  // routes the MoE slots through expert parallelism here, and says what it did (environment.json).
  std::function<std::string(const std::vector<std::shared_ptr<FeedForward>>& ffns)> distribute;
  // Text shown and stored in summary.json after training (the CLI samples from the model).
  std::function<std::string(TransformerLM& model, const std::string& tokenizer_path)> sample;
};

struct TrainResult {
  std::string run_dir;
  nlohmann::json summary;
};

// A rough parameter count from the config alone (embeddings, attention, FFN or MoE experts):
// enough to refuse a run that cannot fit before anything is allocated.
double approx_parameters(const ModelConfig& m);

TrainResult train(const Config& cfg, const TrainOptions& opt);

}  // namespace mf
