// `moeforge repro latent`: LatentMoE's shape and allocation experiments in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

struct LatentReproOptions {
  int64_t multiple = 8;          // rounding multiple of the constant-cost solver
  std::vector<int64_t> latents;  // the sweep's l values (empty: the reference's l x 1/2, 5/8, 1, 5/4, 2)
  int64_t sweep_layers = 0;      // model.n_layers of the sweep (0: the base config's)
};

// (1) shape sweep without the shared expert at fixed l*m, N, K; (2) a proxy run's TwoNN profile
// picks the two-segment split, and where it has one: two-segment vs uniform narrow / wide, swapped,
// reversed and the boundary moved, each layer cost-matched by the solver. Returns results.json's
// content.
nlohmann::json latent_repro(ReproArgs args, const LatentReproOptions& opt);
// results.md (and shape_sweep.svg, id_profile.svg into out_dir) from that content alone.
std::string render_latent_results(const nlohmann::json& results, const std::string& out_dir);

}  // namespace mf
