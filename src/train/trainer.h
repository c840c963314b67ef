// The training loop: AdamW + warmup/cosine, clipping, accumulation, periodic evaluation,
// JSONL metrics, atomic checkpoints and exact resume.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/config.h"

namespace mf {

struct TrainOptions {
  std::string resume;      // checkpoint or run directory; "" = fresh run
  bool overwrite = false;  // replace an existing run directory
  int64_t stop_after = -1; // stop (with a checkpoint) after this many steps of this invocation
};

struct TrainResult {
  std::string run_dir;
  nlohmann::json summary;
};

TrainResult train(const Config& cfg, const TrainOptions& opt);

// The config a checkpoint was trained with (from its model.safetensors metadata).
Config checkpoint_config(const std::string& ckpt_path);

}  // namespace mf
