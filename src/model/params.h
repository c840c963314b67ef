// Parameter accounting and role-driven initialisation, shared by every model (LM and ViT).
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "model/layers.h"

namespace mf {

struct ParamCounts {
  int64_t total = 0, embedding = 0, non_embedding = 0;
  int64_t active = 0;          // used per token: total minus the experts a token does not visit
  int64_t expert_stored = 0;   // routed-expert parameters, each shared pool counted once
  int64_t expert_vanilla = 0;  // what num_experts private experts per MoE layer would store
  int64_t router = 0;          // router parameters (weights and NormRouter scales)
};

// Counts of `root` whose FFN slots are `ffns`; `embedding` parameters are left out of
// non_embedding (the token embedding of an LM, 0 for a ViT).
ParamCounts count_parameters(const torch::nn::Module& root, const std::vector<std::shared_ptr<FeedForward>>& ffns,
                             int64_t embedding);

// A [N, D] matrix with orthonormal rows (N <= D) or columns (N > D), from a normal draw by QR.
at::Tensor orthonormal_like(const at::Tensor& w, at::Generator gen);

// By parameter role (core/param_roles.h): normal(0, model.init_std) for weights and
// embeddings, output projections the same scaled by 1/sqrt(2 n_layers) when
// model.scale_out_init, ones for gains, zeros for biases; in the order of named_parameters(),
// from one generator seeded with `seed`.
void init_by_role(torch::nn::Module& root, uint64_t seed, const ModelConfig& c);

}  // namespace mf
