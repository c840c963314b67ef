// What `train` does with WORLD_SIZE > 1 (moeforge launch, torchrun, srun): join the gloo group,
// make the run data parallel over it (rank 0 reports) and, when asked, split every MoE layer's
// experts over the ranks.
#pragma once
#include <memory>

#include "train/parallel.h"
#include "train/trainer.h"

namespace mf {

// The group `opt` now trains over (keep it alive for the run); nullptr for one process.
std::unique_ptr<DataParallel> join_training_group(TrainOptions& opt, bool expert_parallel);

}  // namespace mf
