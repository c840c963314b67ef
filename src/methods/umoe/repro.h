// `moeforge repro umoe`: UMoE against direct domain fine-tuning in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct UMoEReproOptions {
  std::string domain = "technical";  // the target domain
  int64_t finetune_steps = 300;
  double finetune_lr = 1e-3;
  int64_t calib_samples = 128;  // windows of train.seq_len from the domain's train split
  double prune = 0.5;
  double sigma = 0.05;
};

// Pretrains a vanilla top-k MoE LM on the mixed corpus (the base config), then per seed
// fine-tunes on one domain three ways with the same steps, recipe and batches: directly, after
// UMoE's surgery, and after the one-sided ablation; measures every domain's validation loss,
// the training-loss curves, the routed share of the low-saliency half and what pruning that
// half without retraining costs.
ReproResult umoe_repro(ReproArgs args, const UMoEReproOptions& opt);

}  // namespace mf
