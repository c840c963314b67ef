// The LLaMA building blocks: RMSNorm, rotary embeddings, grouped-query attention
// with a KV cache, and the replaceable feed-forward slot with its dense SwiGLU.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/param_roles.h"

namespace mf {

// Auxiliary losses (router balance losses etc.) collected during one forward pass.
struct AuxLosses {
  std::vector<std::pair<std::string, torch::Tensor>> terms;
  void add(std::string name, torch::Tensor value) { terms.emplace_back(std::move(name), std::move(value)); }
  torch::Tensor total() const;  // undefined tensor when empty
};

// y = x / sqrt(mean(x^2) + eps) * weight
class RMSNormImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  RMSNormImpl(int64_t dim, double eps);
  ParamRoleList param_roles() const override { return {{"weight", ParamRole::Gain}}; }
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// A bias-free Linear whose output joins the residual stream (ParamRole::Output: scaled init).
class OutputLinearImpl : public torch::nn::LinearImpl, public DeclaresParamRoles {
 public:
  OutputLinearImpl(int64_t in, int64_t out) : torch::nn::LinearImpl(torch::nn::LinearOptions(in, out).bias(false)) {}
  ParamRoleList param_roles() const override { return {{"weight", ParamRole::Output}}; }
};
using OutputLinear = std::shared_ptr<OutputLinearImpl>;

// A Linear with a bias (ViT layers); `output` marks a projection into the residual stream.
class BiasedLinearImpl : public torch::nn::LinearImpl, public DeclaresParamRoles {
 public:
  BiasedLinearImpl(int64_t in, int64_t out, bool output = false)
      : torch::nn::LinearImpl(torch::nn::LinearOptions(in, out).bias(true)), output_(output) {}
  ParamRoleList param_roles() const override {
    return {{"bias", ParamRole::Bias}, {"weight", output_ ? ParamRole::Output : ParamRole::Weight}};
  }

 private:
  bool output_;
};
using BiasedLinear = std::shared_ptr<BiasedLinearImpl>;

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
//   q = x Wq (+ bq), k = x Wk (+ bk), v = x Wv (+ bv); each kv head serves n_heads / n_kv_heads
//   query heads; optional RMSNorm of q and k (per head, or over the whole projection) before
//   RoPE; out = softmax(q k^T / sqrt(D) + causal mask) v, then Wo (+ bo).
class AttentionImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  explicit AttentionImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const RopeTable& rope, LayerCache* cache);
  ParamRoleList param_roles() const override {
    return {{"q_proj.bias", ParamRole::Bias}, {"k_proj.bias", ParamRole::Bias}, {"v_proj.bias", ParamRole::Bias}};
  }
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  std::shared_ptr<torch::nn::LinearImpl> o_proj;
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // model.qk_norm
  int64_t n_heads, n_kv_heads, head_dim;
  bool norm_per_head = false;
};
TORCH_MODULE(Attention);

// The FFN slot of a block. Dense SwiGLU and MoE layers implement the same interface and
// report their auxiliary losses through `aux`, so the trainer never changes.
class FeedForward : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) = 0;
};

// SwiGLU: W2 (silu(W1 x) * W3 x)  (HF names: gate_proj = W1, up_proj = W3, down_proj = W2)
class SwiGLU : public FeedForward {
 public:
  SwiGLU(int64_t d_model, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr};
  OutputLinear down_proj;
};

// GELU MLP with biases (ViT/BERT): fc2 gelu(fc1 x + b1) + b2
class GeluMLP : public FeedForward {
 public:
  GeluMLP(int64_t d_model, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  BiasedLinear fc1, fc2;
};

// FFN-slot kinds (model.ffn): "swiglu", "gelu" and "moe" are built in; a method may register its own.
// A factory builds block `layer`'s slot; `plan` holds the MoE blocks' shapes and extensions.
struct MoEPlan;
using FeedForwardFactory =
    std::function<std::shared_ptr<FeedForward>(const ModelConfig& c, int64_t layer, const MoEPlan& plan)>;
void register_ffn_kind(const std::string& kind, FeedForwardFactory make);
bool is_ffn_kind(const std::string& kind);
std::shared_ptr<FeedForward> make_feed_forward(const ModelConfig& c, int64_t layer, const MoEPlan& plan);

}  // namespace mf
