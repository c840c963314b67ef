// `moeforge repro latent`: LatentMoE's shape and allocation experiments in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

// (1) shape sweep at fixed l*m, N, K, ms; (2) a proxy run's TwoNN profile picks the
// two-segment split; two-segment vs uniform narrow / wide and swapped, each layer cost-matched
// by the solver (rounded to `multiple`). Writes shape_sweep.svg and id_profile.svg into args.out.
ReproResult latent_repro(ReproArgs args, int64_t multiple);

}  // namespace mf
