// LLaMA-style decoder LM. Parameter names follow the Hugging Face LLaMA convention
// (model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight).
#pragma once
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include <optional>

#include "model/layers.h"
#include "model/params.h"

namespace mf {

// pre-norm block: h = x + Attn(RMSNorm(x)); out = h + FFN(RMSNorm(h))
class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(const ModelConfig& c, int64_t layer, const MoEPlan& plan);
  torch::Tensor forward(const torch::Tensor& x, const RopeTable& rope, LayerCache* cache, AuxLosses& aux);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  std::shared_ptr<FeedForward> mlp;
};
TORCH_MODULE(DecoderBlock);

class DecoderImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  explicit DecoderImpl(const ModelConfig& c);
  ParamRoleList param_roles() const override { return {{"embed_tokens.weight", ParamRole::Embedding}}; }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<DecoderBlock> blocks;   // the same modules as `layers`, typed
  std::shared_ptr<MoEPlan> moe_plan;  // the MoE blocks' shapes and the methods' extensions
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Decoder);

class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const ModelConfig& c);
  // tokens [B, T] int64 -> logits [B, T, V]. With caches, positions continue after them.
  // `block_outputs` receives the residual stream after every block (intrinsic-dimension probes).
  torch::Tensor forward(const torch::Tensor& tokens, AuxLosses& aux, std::vector<LayerCache>* caches = nullptr,
                        std::vector<torch::Tensor>* block_outputs = nullptr);
  torch::Tensor forward(const torch::Tensor& tokens);
  // forward() without the LM head: the final-normed residual stream [B, T, D], for losses
  // fused with the head (model/fused_loss.h).
  torch::Tensor hidden(const torch::Tensor& tokens, AuxLosses& aux);
  const torch::Tensor& head_weight() const;  // [V, D]: lm_head, or the embedding when tied
  // By parameter role (core/param_roles.h): normal(0, init_std) for weights and embeddings,
  // output projections scaled by 1/sqrt(2 n_layers) when model.scale_out_init, ones for
  // gains, zeros for biases; deterministic in `seed`.
  void init_weights(uint64_t seed);
  ParamCounts param_counts() const;
  std::vector<std::shared_ptr<FeedForward>> feed_forwards() const;
  const ModelConfig& config() const { return cfg_; }
  const RopeTable& rope() const { return rope_; }

  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // absent with model.tie_embeddings (the embedding is the head)

 private:
  torch::Tensor trunk(const torch::Tensor& tokens, AuxLosses& aux, std::vector<LayerCache>* caches = nullptr,
                      std::vector<torch::Tensor>* block_outputs = nullptr);
  ModelConfig cfg_;
  RopeTable rope_;
};
TORCH_MODULE(TransformerLM);

// param_counts() of the LM `c` describes, built one decoder block at a time (a model larger than
// memory); nullopt when its blocks share modules (a method's extension) and the whole model is needed.
std::optional<ParamCounts> blockwise_param_counts(const ModelConfig& c);

// mean next-token cross entropy in float32; logits [B, T, V], targets [B, T]
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace mf
