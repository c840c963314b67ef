#include "model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/init.h"
#include "model/moe_ffn.h"

namespace mf {

DecoderBlockImpl::DecoderBlockImpl(const ModelConfig& c, int64_t layer, const MoEPlan& plan) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.d_model, c.norm_eps));
  self_attn = register_module("self_attn", Attention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.d_model, c.norm_eps));
  mlp = register_module("mlp", make_feed_forward(c, layer, plan));
}

torch::Tensor DecoderBlockImpl::forward(const torch::Tensor& x, const RopeTable& rope, LayerCache* cache,
                                        AuxLosses& aux) {
  auto h = x + self_attn->forward(input_layernorm->forward(x), rope, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h), aux);
}

DecoderImpl::DecoderImpl(const ModelConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.d_model));
  layers = register_module("layers", torch::nn::ModuleList());
  moe_plan = std::make_shared<MoEPlan>(plan_moe(c));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    blocks.emplace_back(c, i, *moe_plan);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
}

TransformerLMImpl::TransformerLMImpl(const ModelConfig& c)
    : cfg_(c), rope_(c.max_seq_len, c.head_width(), c.rope_theta) {
  TORCH_CHECK(c.vocab_size > 0, "model vocab_size must be set (from the tokenizer)");
  model = register_module("model", Decoder(c));
  if (!c.tie_embeddings)
    lm_head =
        register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab_size).bias(false)));
}

torch::Tensor TransformerLMImpl::trunk(const torch::Tensor& tokens, AuxLosses& aux, std::vector<LayerCache>* caches,
                                       std::vector<torch::Tensor>* block_outputs) {
  if (caches && caches->empty()) caches->resize(model->blocks.size());
  auto x = embed_rows(tokens, model->embed_tokens->weight);
  for (size_t i = 0; i < model->blocks.size(); ++i) {
    x = model->blocks[i]->forward(x, rope_, caches ? &(*caches)[i] : nullptr, aux);
    if (block_outputs) block_outputs->push_back(x);
  }
  return model->norm->forward(x);
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens, AuxLosses& aux, std::vector<LayerCache>* caches,
                                         std::vector<torch::Tensor>* block_outputs) {
  return project(trunk(tokens, aux, caches, block_outputs), head_weight());
}

torch::Tensor TransformerLMImpl::hidden(const torch::Tensor& tokens, AuxLosses& aux) { return trunk(tokens, aux); }

const torch::Tensor& TransformerLMImpl::head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) {
  AuxLosses aux;
  return forward(tokens, aux);
}

void TransformerLMImpl::init_weights(uint64_t seed) { init_by_role(*this, seed, cfg_); }

ParamCounts TransformerLMImpl::param_counts() const {
  return count_parameters(*this, feed_forwards(), model->embed_tokens->weight.numel());
}

std::vector<std::shared_ptr<FeedForward>> TransformerLMImpl::feed_forwards() const {
  std::vector<std::shared_ptr<FeedForward>> out;
  for (auto& b : model->blocks) out.push_back(b->mlp);
  return out;
}

std::optional<ParamCounts> blockwise_param_counts(const ModelConfig& c) {
  const auto plan = plan_moe(c);
  if (!plan.extensions.empty() || (c.ffn != "moe" && c.ffn != "swiglu")) return std::nullopt;
  ParamCounts n;
  const ShapesOnly shapes;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    DecoderBlock block(c, i, plan);
    const auto b = count_parameters(*block, {block->mlp}, 0);
    n.total += b.total, n.active += b.active, n.expert_stored += b.expert_stored;
    n.expert_vanilla += b.expert_vanilla, n.router += b.router;
  }
  n.embedding = c.vocab_size * c.d_model;
  const int64_t rest = n.embedding + c.d_model + (c.tie_embeddings ? 0 : c.vocab_size * c.d_model);
  n.total += rest, n.active += rest;
  n.non_embedding = n.total - n.embedding;
  return n;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  auto V = logits.size(-1);
  auto l = logits.reshape({-1, V});
  if (l.scalar_type() != torch::kFloat64) l = l.to(torch::kFloat32);
  return torch::nn::functional::cross_entropy(l, targets.reshape({-1}));
}

}  // namespace mf
