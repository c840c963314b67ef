// The LLaMA building blocks: RMSNorm, rotary embeddings, grouped-query attention
// with a KV cache, and the replaceable feed-forward slot with its dense SwiGLU.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace mf {

// Auxiliary losses (router balance losses etc.) collected during one forward pass.
struct AuxLosses {
  std::vector<std::pair<std::string, torch::Tensor>> terms;
  void add(std::string name, torch::Tensor value) { terms.emplace_back(std::move(name), std::move(value)); }
  torch::Tensor total() const;  // undefined tensor when empty
};

// y = x / sqrt(mean(x^2) + eps) * weight
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding, Hugging Face "rotate_half" layout: for pair (i, i + D/2)
// at position p with angle a = p * theta^(-2i/D):  x_i' = x_i cos a - x_{i+D/2} sin a,
// x_{i+D/2}' = x_{i+D/2} cos a + x_i sin a.
struct RopeTable {
  torch::Tensor cos, sin;  // [max_seq, D] (each half repeated), float64
  RopeTable(int64_t max_seq, int64_t head_dim, double theta);
  // x: [B, H, T, D]; positions start_pos .. start_pos+T-1
  torch::Tensor apply(const torch::Tensor& x, int64_t start_pos) const;
};

struct LayerCache {  // keys/values seen so far, [B, Hkv, S, D]
  torch::Tensor k, v;
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

// Causal multi-head attention with n_kv_heads <= n_heads (GQA):
//   q = x Wq, k = x Wk, v = x Wv; each kv head serves n_heads / n_kv_heads query heads;
//   out = softmax(q k^T / sqrt(D) + causal mask) v, then Wo.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const RopeTable& rope, LayerCache* cache);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t n_heads, n_kv_heads, head_dim;
};
TORCH_MODULE(Attention);

// The FFN slot of a block. Dense SwiGLU today; MoE layers implement the same interface
// and report their auxiliary losses through `aux`, so the trainer never changes.
class FeedForward : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) = 0;
  virtual std::vector<std::string> output_projection_names() const = 0;  // for scaled init
};

// SwiGLU: W2 (silu(W1 x) * W3 x)  (HF names: gate_proj = W1, up_proj = W3, down_proj = W2)
class SwiGLU : public FeedForward {
 public:
  SwiGLU(int64_t d_model, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  std::vector<std::string> output_projection_names() const override { return {"down_proj.weight"}; }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};

struct ExpertPool;  // model/moe_ffn.h
// Builds the FFN slot of block `layer` from the config (the one place new FFN kinds plug in);
// `pool` is the UniPool group the layer routes into, if any.
std::shared_ptr<FeedForward> make_feed_forward(const ModelConfig& c, int64_t layer,
                                               std::shared_ptr<ExpertPool> pool = nullptr);

}  // namespace mf
