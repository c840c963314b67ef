// `moeforge bench unif`: one UniF-MoE layer against top-2 and top-1 MoE layers with the same
// experts (GELU with biases, upcycled-style), inference and forward+backward, at a seeded
// routing whose sharpness is set by scaling the layer's input (a trained router is sharper
// than a fresh one). The claim checked: UniF-MoE's time relative to top-2 follows its mean
// activated blocks, C_B / (2 B).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mf {

struct UniFBenchOptions {
  int64_t tokens = 4096, d_model = 384, hidden = 1536, experts = 6, blocks = 8;
  std::vector<double> input_scales = {1.0, 4.0};
  int iters = 10;
};

struct UniFBenchRow {
  std::string layer;  // "unif", "top-2", "top-1"
  double input_scale = 1;
  double mean_blocks = 0;            // activated (expert, block) units per token
  double infer_seconds = 0;          // forward without grad (best round)
  double train_seconds = 0;          // forward + backward (best round)
  std::vector<double> infer_rounds;  // forward without grad, each round
  std::vector<double> train_rounds;  // forward + backward, each round
};

std::vector<UniFBenchRow> bench_unif(const UniFBenchOptions& opt);

// The table, the verdicts per input scale (UniF's time vs top-2 within 15 % of its block ratio
// C_B / (2B) in inference, issue 11; within 20 % in training, issue 41; each time ratio the median
// of same-round ratios, slots.h's median_ratio) and the same rows as JSON.
struct UniFBenchReport {
  std::string text;
  nlohmann::json json;
};
UniFBenchReport unif_bench_report(const std::vector<UniFBenchRow>& rows, const UniFBenchOptions& opt, int threads);

}  // namespace mf
