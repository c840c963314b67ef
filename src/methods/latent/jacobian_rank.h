// Local Jacobian rank of routed SwiGLU experts (../shared/specs/latentmoe.md): with g = W_g z,
// u = W_u z, J(z) = W_o [diag(silu'(g) * u) W_g + diag(silu(g)) W_u], rank <= q = min(l, m).
#pragma once
#include <ATen/ATen.h>

#include "data/shards.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "moe/banks.h"

namespace mf {

// J of expert e at input z [l] -> [l, l]
at::Tensor expert_jacobian(const ExpertBank& bank, int64_t e, const at::Tensor& z);
// singular values above rel_tol * sigma_max
int64_t numerical_rank(const at::Tensor& J, double rel_tol);

struct LayerJacobianRank {
  int64_t layer = 0, q = 0, samples = 0;
  double mean_rank = 0, min_rank = 0, max_rank = 0;  // in units of q
};
// For each MoE layer: up to `samples` routed (token, expert) pairs, an equal share from every
// domain's windows of `split`, taken round-robin over the experts the pairs were routed to (so
// every used expert is sampled before any is sampled twice); each pair's Jacobian rank / q.
std::vector<LayerJacobianRank> jacobian_ranks(TransformerLM& model, const PreparedCorpus& corpus,
                                              const std::string& split, int64_t seq_len, int64_t samples,
                                              double rel_tol);

}  // namespace mf
