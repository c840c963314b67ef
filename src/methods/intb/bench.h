// `moeforge bench intb`: one IntBMoE slot's inference time and resident memory per request as
// the pool grows (E = 1 ... 128), with the composition cache and recomposing every forward
// (the paper's figure: cached cost flat in E, uncached growing); and one training step
// (forward + backward) of the slot against top-2 MoE, dense and SMEAR slots with the same
// parameters.
#pragma once
#include <string>
#include <vector>

#include "core/table.h"

namespace mf {

struct IntBBenchOptions {
  int64_t tokens = 197, d_model = 192, hidden = 768, blocks = 8, top_k = 2, shared_hidden = 512;
  std::vector<int64_t> basis = {1, 4, 16, 64, 128};
  int iters = 5;
  int64_t train_tokens = 2048, train_basis = 16;  // the training comparison's batch and pool
};

struct IntBBenchRow {
  int64_t basis = 0;
  double cached_seconds = 0, uncached_seconds = 0;  // one forward of `tokens` tokens, no grad
  int64_t cached_bytes = 0;    // what a request touches with the cache: composed blocks, router, filter, shared
  int64_t uncached_bytes = 0;  // every parameter plus the blocks composed for this forward
  int64_t flops_cached = 0, flops_uncached = 0;  // per token (info's accounting)
};

std::vector<IntBBenchRow> bench_intb(const IntBBenchOptions& opt);

struct IntBTrainRow {
  std::string arm, label;
  int64_t parameters = 0;  // of the slot
  double seconds = 0;      // forward + backward of `train_tokens` tokens, aux losses included
};
// The IntBMoE slot (E = train_basis) and the repro's baselines at its parameter count.
std::vector<IntBTrainRow> bench_intb_training(const IntBBenchOptions& opt);

// `bench intb`'s two tables (inference as the pool grows; the training step against the baselines)
ResultTable intb_inference_table(const std::vector<IntBBenchRow>& rows);
ResultTable intb_training_table(const std::vector<IntBTrainRow>& rows, int64_t train_tokens);

}  // namespace mf
