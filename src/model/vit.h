// ViT/DeiT-style image classifier whose FFN slots are the LM's: dense (gelu), MoE, UniPool,
// LatentMoE, ... by config alone. Patches -> linear patch embedding, a class token, learned
// position embeddings, pre-norm blocks (LayerNorm, multi-head attention without a causal
// mask, the FFN slot), final LayerNorm, a linear head on the class token.
// Tensor names: [stem,] patch_embed, cls_token, pos_embed, layers.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.*},
// norm, head.
#pragma once
#include <torch/nn/modules/container/modulelist.h>
#include <functional>

#include "model/layers.h"
#include "model/params.h"

namespace mf {

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension
class LayerNormImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  LayerNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  ParamRoleList param_roles() const override { return {{"weight", ParamRole::Gain}, {"bias", ParamRole::Bias}}; }
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// softmax(q k^T / sqrt(D)) v over all tokens (no mask), heads concatenated, then proj.
class ViTAttentionImpl : public torch::nn::Module {
 public:
  ViTAttentionImpl(int64_t d_model, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x_BLD);
  BiasedLinear qkv, proj;
  int64_t heads;
};
TORCH_MODULE(ViTAttention);

// x + attn(norm1(x)), then + mlp(norm2(.))
class ViTBlockImpl : public torch::nn::Module {
 public:
  ViTBlockImpl(const ModelConfig& c, int64_t layer, const MoEPlan& plan);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux);
  LayerNorm norm1{nullptr}, norm2{nullptr};
  ViTAttention attn{nullptr};
  std::shared_ptr<FeedForward> mlp;
};
TORCH_MODULE(ViTBlock);

// Early-convolution stem (Xiao et al. 2021): y[s, i, j] = gelu(b[s] + sum_{c, u, v} w[s, c, u, v] x[c, i + u - 1, j + v
// - 1]), zero padding, so the image keeps its size. The weight is stored [S, C 3 3] so that its fan-in is its last
// dimension (PyTorch's convolution init).
class ConvStemImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  ConvStemImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& images);
  ParamRoleList param_roles() const override {
    return {{"weight", ParamRole::FanInUniform}, {"bias", ParamRole::Bias}};
  }
  torch::Tensor weight, bias;  // [out, in 3 3], [out]
  int64_t in;
};
TORCH_MODULE(ConvStem);

// images [B, channels, Y, X] -> patches [B, L, channels p p], patch (i, j) at row i * (X / p) + j, channels
// then rows then columns inside a patch.
torch::Tensor patchify(const torch::Tensor& images, int64_t patch);

class VisionTransformerImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  explicit VisionTransformerImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& images, AuxLosses& aux);  // -> logits [B, classes]
  torch::Tensor forward(const torch::Tensor& images);
  ParamRoleList param_roles() const override {
    return {{"cls_token", ParamRole::Embedding}, {"pos_embed", ParamRole::Embedding}};
  }
  void init_weights(uint64_t seed);  // as the LM: normal(init_std), outputs scaled, gains 1, biases 0
  ParamCounts param_counts() const;
  std::vector<std::shared_ptr<FeedForward>> feed_forwards() const;
  const ModelConfig& config() const { return cfg_; }

  ConvStem stem{nullptr};  // null unless model.stem_channels > 0
  BiasedLinear patch_embed, head;
  torch::Tensor cls_token, pos_embed;  // [1, 1, D], [1, 1 + N, D]
  torch::nn::ModuleList layers{nullptr};
  std::vector<ViTBlock> blocks;
  std::shared_ptr<MoEPlan> moe_plan;
  LayerNorm norm{nullptr};

 private:
  ModelConfig cfg_;
};
TORCH_MODULE(VisionTransformer);

// logits [B, classes] of images [B, channels, Y, X]; with flip_average the mean of the logits of the images and of
// their horizontal mirror images. `after_forward` runs after each forward pass.
torch::Tensor classify_logits(VisionTransformerImpl& model, const torch::Tensor& images, bool flip_average,
                              const std::function<void()>& after_forward = {});

// mean cross entropy in float32 (float64 stays float64); logits [B, classes], labels [B]
torch::Tensor classify_loss(const torch::Tensor& logits, const torch::Tensor& labels, double smoothing = 0);

}  // namespace mf
