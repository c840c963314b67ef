// `moeforge repro unipool`: UniPool's ablation (paper table 5) in miniature.
#pragma once
#include "train/repro_runs.h"

namespace mf {

// Trains every variant (vanilla, shared pool + per-layer or pool aux, NormRouter, full UniPool,
// a half-size pool, with `g2` also G = 2) for args.seeds seeds, measures expert usage (writing
// heatmaps into args.out) and, with `probe`, the routing-randomization probe.
ReproResult unipool_repro(ReproArgs args, bool g2, bool probe);

}  // namespace mf
