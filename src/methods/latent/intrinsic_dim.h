// Layerwise intrinsic dimension (TwoNN, Facco et al. 2017) and the two-segment LatentMoE
// allocation it guides (../shared/specs/latentmoe.md).
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "data/shards.h"
#include "model/transformer.h"

namespace mf {

// TwoNN on the distinct points of X [n, D]: mu_j = r2 / r1 (nearest and second-nearest neighbour distances,
// samples with r1 = 0 dropped), F_i = i / n over sorted mu, the largest `discard` fraction
// dropped, d = sum x y / sum x^2 with x = log mu, y = -log(1 - F).
double twonn_dimension(const at::Tensor& X, double discard = 0.1);

struct IdProfile {
  std::vector<double> id;  // one per block output (embedding output excluded)
  int64_t tokens_collected = 0, tokens_used = 0;
};
// Token representations after every block on `split` windows: `collect` tokens, `keep` of them
// drawn with `seed`, TwoNN per block.
IdProfile intrinsic_dimension_profile(TransformerLM& model, const PreparedCorpus& corpus, const std::string& split,
                                      int64_t seq_len, int64_t collect, int64_t keep, uint64_t seed);

// Split point s (prefix = entries [0, s)) with max(id[0..s)) < min(id[s..)), the largest gap
// among valid splits; -1 if none.
int64_t two_segment_split(const std::vector<double>& id);

}  // namespace mf
