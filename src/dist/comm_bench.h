// `moeforge bench comm` (under `moeforge launch`): what the group's collectives cost here, and
// what that would mean for expert parallelism at paper scale (a model, not a measurement).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/parallel.h"

namespace mf {

struct CommBenchOptions {
  int64_t tokens = 4096, d = 512, top_k = 8;  // the fine-grained MoE shape, tokens per rank
  int iters = 5;
};

struct CommBenchRow {
  std::string what;
  double bytes = 0, seconds = 0, gbs = 0;  // bytes each rank sends; best time; bytes / seconds
};

// Checks an all-to-all with unequal splits (throws naming the rank and row on a wrong value),
// then times all-reduces and the MoE dispatch all-to-all.
std::vector<CommBenchRow> bench_comm(DataParallel& group, const CommBenchOptions& opt);

// Dispatch + combine, forward and backward, per MoE layer and rank, for `tokens` per rank with
// top-k routing spread uniformly over `ranks`: bytes sent (float32 rows of width d).
double expert_parallel_bytes(int64_t tokens, int64_t d, int64_t top_k, int64_t ranks);

}  // namespace mf
