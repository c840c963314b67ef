// `moeforge repro unif`: UniF-MoE's upcycling comparison in miniature, on an LM under a domain
// shift (pretrained without the target domain, fine-tuned on it) or on a ViT under a class shift
// (pretrained without the target classes, fine-tuned on them).
#pragma once
#include <nlohmann/json.hpp>

#include "train/repro_runs.h"

namespace mf {

struct UniFReproOptions {
  std::string layers = "1,3";        // the two blocks to upcycle
  int64_t experts = 6;               // K (UniF-MoE: residual experts + its shared one)
  int64_t blocks = 8;                // B
  double top_p = 0.5;                // the top-p arm's mass
  std::string domain = "technical";  // LM: the fine-tuning domain, left out of the pretraining
  std::string classes = "0,2,4,6";   // ViT: the fine-tuning classes (the four upper-body garments), likewise
  int64_t finetune_steps = 1000;
  double finetune_lr = 1e-3;
  int64_t secondary_seeds = 3;  // top-1, top-p and the three ablations (dense, top-2, UniF-MoE: --seeds)
  int64_t timing_rounds = 15;   // interleaved re-timing rounds per seed
};

// Pretrains the dense ViT or LM of the base config (--config; without `classes` or `domain`), upcycles
// `layers` into top-2, top-1, top-p and UniF-MoE (and its three ablations) with the same K, H, B,
// fine-tunes every arm and a dense control identically per seed (on `classes` or `domain` alone), and
// collects quality (LM: `domain`'s validation loss; ViT: validation accuracy), activated blocks
// and the upcycled slots' inference time re-timed in interleaved rounds into results.json;
// render_unif_results() writes results.md from it.
nlohmann::json unif_repro(ReproArgs args, const UniFReproOptions& opt);
std::string render_unif_results(const nlohmann::json& results, const std::string& out_dir);

}  // namespace mf
