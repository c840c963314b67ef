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
// One parameter's step of init_by_role (`gen` as it stands after the parameters before it): what
// a streamed writer replays tensor by tensor to give the same values without the whole model.
void init_parameter(at::Tensor& t, ParamRole role, at::Generator& gen, const ModelConfig& c);

// An estimate from the config alone (embeddings, attention, the FFN or the MoE experts, SwiGLU or
// GELU with biases, router and shared expert, dense blocks beside MoE ones; a method's own modules are not counted):
// enough to refuse a run that cannot fit, or a Hugging Face config.json whose sizes the stored
// tensors cannot hold, before anything is allocated. Counts reported anywhere come from
// the built model (param_counts, blockwise_param_counts), never from this.
double approx_parameters(const ModelConfig& m);

}  // namespace mf
