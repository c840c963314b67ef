#include "model/vit.h"

#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <cmath>

#include "model/moe_ffn.h"
#include "model/small_attention.h"

namespace mf {

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
  bias = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, weight.to(x.dtype()), bias.to(x.dtype()), eps);
}

ViTAttentionImpl::ViTAttentionImpl(int64_t d, int64_t heads_) : heads(heads_) {
  qkv = register_module("qkv", std::make_shared<BiasedLinearImpl>(d, 3 * d));
  proj = register_module("proj", std::make_shared<BiasedLinearImpl>(d, d, /*output=*/true));
}

torch::Tensor ViTAttentionImpl::forward(const torch::Tensor& x_BLD) {
  const int64_t B = x_BLD.size(0), L = x_BLD.size(1), D = x_BLD.size(2), Dh = D / heads;
  auto qkv_BL3HDh = qkv->forward(x_BLD).view({B, L, 3, heads, Dh});
  if (small_attention_applies(qkv_BL3HDh, L))
    return proj->forward(small_attention_packed(qkv_BL3HDh, /*causal=*/false).view({B, L, D}));
  auto qkv_3BHLDh = qkv_BL3HDh.permute({2, 0, 3, 1, 4});
  auto q = qkv_3BHLDh[0], k = qkv_3BHLDh[1], v = qkv_3BHLDh[2];
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
  auto out = torch::matmul(torch::softmax(scores, -1), v);  // [B, H, L, Dh]
  return proj->forward(out.transpose(1, 2).reshape({B, L, D}));
}

ViTBlockImpl::ViTBlockImpl(const ModelConfig& c, int64_t layer, const MoEPlan& plan) {
  norm1 = register_module("norm1", LayerNorm(c.d_model, c.norm_eps));
  attn = register_module("attn", ViTAttention(c.d_model, c.n_heads));
  norm2 = register_module("norm2", LayerNorm(c.d_model, c.norm_eps));
  mlp = register_module("mlp", make_feed_forward(c, layer, plan));
}

torch::Tensor ViTBlockImpl::forward(const torch::Tensor& x, AuxLosses& aux) {
  auto h = x + attn->forward(norm1->forward(x));
  return h + mlp->forward(norm2->forward(h), aux);
}

ConvStemImpl::ConvStemImpl(int64_t in_, int64_t out) : in(in_) {
  weight = register_parameter("weight", torch::zeros({out, in * 9}));
  bias = register_parameter("bias", torch::zeros({out}));
}

torch::Tensor ConvStemImpl::forward(const torch::Tensor& images) {
  auto w = weight.to(images.dtype()).view({weight.size(0), in, 3, 3});
  return torch::gelu(torch::conv2d(images, w, bias.to(images.dtype()), /*stride=*/1, /*padding=*/1));
}

torch::Tensor patchify(const torch::Tensor& images, int64_t p) {
  const int64_t B = images.size(0), channels = images.size(1), Y = images.size(2), X = images.size(3);
  return images.view({B, channels, Y / p, p, X / p, p})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, (Y / p) * (X / p), channels * p * p});
}

VisionTransformerImpl::VisionTransformerImpl(const ModelConfig& c) : cfg_(c) {
  const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
  if (c.stem_channels > 0) stem = register_module("stem", ConvStem(c.channels, c.stem_channels));
  const int64_t channels = c.stem_channels > 0 ? c.stem_channels : c.channels;
  patch_embed = register_module("patch_embed",
                                std::make_shared<BiasedLinearImpl>(channels * c.patch_size * c.patch_size, c.d_model));
  cls_token = register_parameter("cls_token", torch::zeros({1, 1, c.d_model}));
  pos_embed = register_parameter("pos_embed", torch::zeros({1, 1 + patches, c.d_model}));
  layers = register_module("layers", torch::nn::ModuleList());
  moe_plan = std::make_shared<MoEPlan>(plan_moe(c));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    blocks.emplace_back(c, i, *moe_plan);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", LayerNorm(c.d_model, c.norm_eps));
  head = register_module("head", std::make_shared<BiasedLinearImpl>(c.d_model, c.num_classes));
}

torch::Tensor VisionTransformerImpl::forward(const torch::Tensor& images, AuxLosses& aux) {
  auto x = patch_embed->forward(patchify(stem ? stem->forward(images) : images, cfg_.patch_size));
  x = torch::cat({cls_token.to(x.dtype()).expand({x.size(0), 1, x.size(2)}), x}, 1) + pos_embed.to(x.dtype());
  for (auto& b : blocks) x = b->forward(x, aux);
  auto pooled = cfg_.pool == "mean" ? x.narrow(1, 1, x.size(1) - 1).mean(1) : x.select(1, 0);
  return head->forward(norm->forward(pooled));
}

torch::Tensor VisionTransformerImpl::forward(const torch::Tensor& images) {
  AuxLosses aux;
  return forward(images, aux);
}

void VisionTransformerImpl::init_weights(uint64_t seed) { init_by_role(*this, seed, cfg_); }

ParamCounts VisionTransformerImpl::param_counts() const { return count_parameters(*this, feed_forwards(), 0); }

std::vector<std::shared_ptr<FeedForward>> VisionTransformerImpl::feed_forwards() const {
  std::vector<std::shared_ptr<FeedForward>> out;
  for (auto& b : blocks) out.push_back(b->mlp);
  return out;
}

torch::Tensor classify_logits(VisionTransformerImpl& model, const torch::Tensor& images, bool flip_average,
                              const std::function<void()>& after_forward) {
  auto logits = model.forward(images);
  if (after_forward) after_forward();
  if (!flip_average) return logits;
  auto mirrored = model.forward(images.flip({-1}));
  if (after_forward) after_forward();
  return (logits + mirrored) * 0.5;
}

torch::Tensor classify_loss(const torch::Tensor& logits, const torch::Tensor& labels, double smoothing) {
  auto l = logits.scalar_type() == torch::kFloat64 ? logits : logits.to(torch::kFloat32);
  return torch::nn::functional::cross_entropy(
      l, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(smoothing));
}

}  // namespace mf
