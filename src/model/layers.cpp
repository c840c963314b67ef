#include "model/layers.h"

#include "core/bf16.h"

#include "model/moe_ffn.h"
#include "model/rms_norm_rows.h"
#include "model/rope_rows.h"
#include "model/small_attention.h"

#include <torch/nn/functional/activation.h>
#include <torch/version.h>

#include <cmath>

namespace mf {

torch::Tensor AuxLosses::total() const {
  torch::Tensor t;
  for (const auto& [name, v] : terms) t = t.defined() ? t + v : v;
  return t;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm_rows(x, weight, eps); }

RopeTable::RopeTable(int64_t max_seq, int64_t head_dim, double theta) {
  auto half = head_dim / 2;
  auto inv_freq = torch::pow(theta, -torch::arange(0, half, torch::kFloat64) * 2.0 / head_dim);
  auto ang = torch::outer(torch::arange(0, max_seq, torch::kFloat64), inv_freq);  // [S, D/2]
  auto full = torch::cat({ang, ang}, -1);
  cos = full.cos();
  sin = full.sin();
}

torch::Tensor RopeTable::apply(const torch::Tensor& x, int64_t start_pos) const {
  auto T = x.size(2);
  TORCH_CHECK(start_pos + T <= cos.size(0), "sequence position ", start_pos + T, " exceeds model.max_seq_len ",
              cos.size(0));
  auto c = cos.narrow(0, start_pos, T).to(x.dtype());
  auto s = sin.narrow(0, start_pos, T).to(x.dtype());
  return rope_rows(x, c, s);
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : n_heads(c.n_heads), n_kv_heads(c.n_kv_heads), head_dim(c.head_width()), norm_per_head(c.qk_norm == "head") {
  auto lin = [&](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(c.qkv_bias));
  };
  q_proj = register_module("q_proj", lin(c.d_model, n_heads * head_dim));
  k_proj = register_module("k_proj", lin(c.d_model, n_kv_heads * head_dim));
  v_proj = register_module("v_proj", lin(c.d_model, n_kv_heads * head_dim));
  if (c.o_bias)
    o_proj = register_module("o_proj", std::make_shared<BiasedLinearImpl>(n_heads * head_dim, c.d_model, true));
  else
    o_proj = register_module("o_proj", std::make_shared<OutputLinearImpl>(n_heads * head_dim, c.d_model));
  if (c.qk_norm != "none") {
    q_norm = register_module("q_norm", RMSNorm(norm_per_head ? head_dim : n_heads * head_dim, c.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(norm_per_head ? head_dim : n_kv_heads * head_dim, c.norm_eps));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTable& rope, LayerCache* cache) {
  const auto B = x.size(0), T = x.size(1);
  const int64_t start = cache ? cache->length() : 0;
  auto q = project(x, q_proj->weight, q_proj->bias), k = project(x, k_proj->weight, k_proj->bias);
  if (q_norm && !norm_per_head) q = q_norm->forward(q), k = k_norm->forward(k);
  q = q.view({B, T, n_heads, head_dim});
  k = k.view({B, T, n_kv_heads, head_dim});
  if (q_norm && norm_per_head) q = q_norm->forward(q), k = k_norm->forward(k);
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = project(x, v_proj->weight, v_proj->bias).view({B, T, n_kv_heads, head_dim}).transpose(1, 2);
  q = rope.apply(q, start);
  k = rope.apply(k, start);
  if (cache) {
    if (cache->k.defined()) {
      k = torch::cat({cache->k, k}, 2);
      v = torch::cat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
  }
  const auto S = k.size(2);
  torch::Tensor out;
  if (small_attention_applies(q, S)) {
    out = small_attention(q, k, v, /*causal=*/true);  // GQA read in place
  } else if (n_kv_heads != n_heads) {                 // GQA: query head h reads kv head h / (n_heads / n_kv_heads)
    k = k.repeat_interleave(n_heads / n_kv_heads, 1);
    v = v.repeat_interleave(n_heads / n_kv_heads, 1);
  }
#if TORCH_VERSION_MAJOR >= 2
  if (!out.defined() && start == 0) out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#endif
  if (!out.defined()) {
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    // query t (absolute position start + t) may see keys 0 .. start + t
    auto mask = torch::ones({T, S}, torch::kBool).triu(start + 1);
    scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
    out = torch::matmul(torch::softmax(scores, -1), v);
  }
  out = out.transpose(1, 2).reshape({B, T, n_heads * head_dim});
  return project(out, o_proj->weight, o_proj->bias);
}

SwiGLU::SwiGLU(int64_t d, int64_t hidden) {
  auto lin = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  gate_proj = register_module("gate_proj", lin(d, hidden));
  up_proj = register_module("up_proj", lin(d, hidden));
  down_proj = register_module("down_proj", std::make_shared<OutputLinearImpl>(hidden, d));
}

torch::Tensor SwiGLU::forward(const torch::Tensor& x, AuxLosses&) {
  return project(torch::silu(project(x, gate_proj->weight)) * project(x, up_proj->weight), down_proj->weight);
}

GeluMLP::GeluMLP(int64_t d, int64_t hidden) {
  fc1 = register_module("fc1", std::make_shared<BiasedLinearImpl>(d, hidden));
  fc2 = register_module("fc2", std::make_shared<BiasedLinearImpl>(hidden, d, /*output=*/true));
}

torch::Tensor GeluMLP::forward(const torch::Tensor& x, AuxLosses&) {
  return project(torch::gelu(project(x, fc1->weight, fc1->bias)), fc2->weight, fc2->bias);
}

namespace {
std::shared_ptr<FeedForward> dense_ffn(const std::string& kind, const ModelConfig& c) {
  if (kind == "gelu") return std::make_shared<GeluMLP>(c.d_model, c.ffn_hidden);
  return std::make_shared<SwiGLU>(c.d_model, c.ffn_hidden);
}

std::map<std::string, FeedForwardFactory>& ffn_kinds() {
  static std::map<std::string, FeedForwardFactory> kinds = {
      {"swiglu", [](const ModelConfig& c, int64_t, const MoEPlan&) { return dense_ffn("swiglu", c); }},
      {"gelu", [](const ModelConfig& c, int64_t, const MoEPlan&) { return dense_ffn("gelu", c); }},
      {"moe",
       [](const ModelConfig& c, int64_t layer, const MoEPlan& plan) -> std::shared_ptr<FeedForward> {
         if (is_moe_layer(c, layer)) return std::make_shared<MoEFeedForward>(c, layer, plan);
         return dense_ffn(c.moe.dense_ffn, c);
       }},
  };
  return kinds;
}
}  // namespace

void register_ffn_kind(const std::string& kind, FeedForwardFactory make) { ffn_kinds()[kind] = std::move(make); }
bool is_ffn_kind(const std::string& kind) { return ffn_kinds().count(kind) > 0; }

std::shared_ptr<FeedForward> make_feed_forward(const ModelConfig& c, int64_t layer, const MoEPlan& plan) {
  auto it = ffn_kinds().find(c.ffn);
  if (it == ffn_kinds().end()) throw ConfigError("model.ffn = \"" + c.ffn + "\" is not a registered FFN-slot kind");
  return it->second(c, layer, plan);
}

}  // namespace mf
