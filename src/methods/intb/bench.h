// `moeforge bench intb`: one IntBMoE slot's inference time and resident memory per request as
// the pool grows (E = 1 ... 128), with the composition cache and recomposing every forward
// (the paper's figure: cached cost flat in E, uncached growing).
#pragma once
#include <string>
#include <vector>

namespace mf {

struct IntBBenchOptions {
  int64_t tokens = 197, d_model = 192, hidden = 768, blocks = 8, top_k = 2, shared_hidden = 512;
  std::vector<int64_t> basis = {1, 4, 16, 64, 128};
  int iters = 5;
};

struct IntBBenchRow {
  int64_t basis = 0;
  double cached_seconds = 0, uncached_seconds = 0;  // one forward of `tokens` tokens, no grad
  int64_t cached_bytes = 0;    // what a request touches with the cache: composed blocks, router, filter, shared
  int64_t uncached_bytes = 0;  // every parameter plus the blocks composed for this forward
  int64_t flops_cached = 0, flops_uncached = 0;  // per token (info's accounting)
};

std::vector<IntBBenchRow> bench_intb(const IntBBenchOptions& opt);

}  // namespace mf
