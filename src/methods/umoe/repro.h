// `moeforge repro umoe`: UMoE against direct domain fine-tuning in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct UMoEReproOptions {
  std::string domain = "technical";  // the target domain
  int64_t finetune_steps = 1500;
  double finetune_lr = 1e-3;
  int64_t calib_samples = 128;  // windows of train.seq_len from the domain's train split
  double prune = 0.5;
  double sigma = 0.05;
};

// Pretrains a vanilla top-k MoE LM on the mixed corpus (the base config) and measures its
// experts' domain specialisation, then per seed fine-tunes on one domain three ways with the
// same steps, recipe and batches: directly, after UMoE's surgery, and after the one-sided
// ablation; collects every domain's held-out loss at four points and at the end, the
// training-loss curves, the routed share of the low-saliency half and what pruning that half
// without retraining costs. Returns results.json's content.
nlohmann::json umoe_repro(ReproArgs args, const UMoEReproOptions& opt);
// results.md (and loss_curves.svg, pretrained_saliency.svg into out_dir) from that content alone.
std::string render_umoe_results(const nlohmann::json& results, const std::string& out_dir);

}  // namespace mf
