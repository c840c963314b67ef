// Autoregressive sampling with a KV cache: temperature, nucleus (top-p), seeded.
#pragma once
#include <vector>

#include "model/transformer.h"

namespace mf {

struct SamplingOptions {
  int64_t max_tokens = 64;
  double temperature = 0.8;  // 0 = greedy
  double top_p = 0.9;
  uint64_t seed = 7;
  int stop_token = -1;  // e.g. the tokenizer's EOS
};

// Returns only the newly generated token ids.
std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt);

// Several prompts of one length decoded together (one forward per step for the whole batch,
// one KV cache); row r's ids stop at its first stop token. Row r samples from its own
// generator seeded opt.seed + r, so row 0 equals generate() on that prompt.
std::vector<std::vector<int>> generate_batch(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                                             const SamplingOptions& opt);

// Keeps the smallest set of most probable tokens whose mass reaches top_p; renormalizes.
at::Tensor top_p_filter(const at::Tensor& probs, double top_p);

}  // namespace mf
