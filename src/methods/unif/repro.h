// `moeforge repro unif`: UniF-MoE's upcycling comparison in miniature, on the vision backbone or an LM.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct UniFReproOptions {
  std::string layers = "1,3";  // the two blocks to upcycle
  int64_t experts = 6;         // K (UniF-MoE: residual experts + its shared one)
  int64_t blocks = 8;          // B
  double top_p = 0.5;          // the top-p arm's mass
  int64_t finetune_steps = 400;
  double finetune_lr = 1e-3;
};

// Pretrains the dense ViT or LM of the base config (--config), upcycles `layers` into top-2,
// top-1, top-p and UniF-MoE (and its three ablations) with the same K, H, B, fine-tunes every arm and
// a dense control identically for every seed, and measures quality (ViT: test accuracy; LM:
// validation loss), activated blocks and the MoE layers' inference time.
ReproResult unif_repro(ReproArgs args, const UniFReproOptions& opt);

}  // namespace mf
