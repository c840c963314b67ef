#include "model/params.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "model/moe_ffn.h"

namespace mf {

ParamCounts count_parameters(const torch::nn::Module& root, const std::vector<std::shared_ptr<FeedForward>>& ffns,
                             int64_t embedding) {
  ParamCounts c;
  for (auto& p : root.parameters()) c.total += p.numel();
  c.embedding = embedding;
  c.non_embedding = c.total - c.embedding;
  // active = total - every stored routed expert + the k experts each MoE layer uses
  c.active = c.total;
  std::vector<const ExpertBank*> seen;
  for (auto& m : moe_layers(ffns)) {
    const auto& bank = *m->experts;
    const int64_t bank_params = bank.parameter_count();
    const int64_t per_expert = bank_params / bank.num_units();
    if (std::find(seen.begin(), seen.end(), &bank) == seen.end()) {
      seen.push_back(&bank);
      c.expert_stored += bank_params;
      c.active -= bank_params;
    }
    c.active += m->gate->options().top_k * per_expert;
    c.expert_vanilla += m->shape().vanilla_experts * per_expert;
    for (auto& p : m->gate->parameters()) c.router += p.numel();
  }
  return c;
}

at::Tensor orthonormal_like(const at::Tensor& w, at::Generator gen) {
  auto a = at::empty({w.size(0), w.size(1)}, w.options().dtype(at::kDouble)).normal_(0.0, 1.0, gen);
  const bool rows = w.size(0) <= w.size(1);
  auto [q, r] = at::linalg_qr(rows ? a.t() : a);  // q: orthonormal columns
  q = q * r.diagonal().sign().unsqueeze(0);       // the sign convention that makes q unique
  return (rows ? q.t() : q).to(w.dtype()).contiguous();
}

void init_parameter(at::Tensor& t, ParamRole role, at::Generator& gen, const ModelConfig& c) {
  torch::NoGradGuard no_grad;
  switch (role) {
    case ParamRole::Gain: t.fill_(1.0); break;
    case ParamRole::Bias: t.zero_(); break;
    case ParamRole::Output:
      t.normal_(0.0, c.init_std / (c.scale_out_init ? std::sqrt(2.0 * c.n_layers) : 1.0), gen);
      break;
    case ParamRole::Orthonormal: t.copy_(orthonormal_like(t, gen)); break;
    case ParamRole::FanInUniform: {
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(-1)));
      t.uniform_(-bound, bound, gen);
      break;
    }
    case ParamRole::UnitNormal: t.normal_(0.0, 1.0, gen); break;
    case ParamRole::Scale: break;
    default: t.normal_(0.0, c.init_std, gen);
  }
}

void init_by_role(torch::nn::Module& root, uint64_t seed, const ModelConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto roles = collect_param_roles(root);
  for (auto& p : root.named_parameters()) init_parameter(p.value(), roles.at(p.key()), gen, c);
}

double approx_parameters(const ModelConfig& m) {
  const double d = static_cast<double>(m.d_model), L = static_cast<double>(m.n_layers);
  const double hd = static_cast<double>(m.head_width());
  const double attention = d * hd * static_cast<double>(2 * m.n_heads + 2 * m.n_kv_heads);
  // an FFN of width f: SwiGLU 3 d f, GELU 2 d f, plus f + d with biases
  const auto ffn_of = [&](bool gelu, bool bias, double f) { return (gelu ? 2.0 : 3.0) * d * f + (bias ? f + d : 0.0); };
  double ffn = ffn_of(m.ffn == "gelu", m.ffn == "gelu", static_cast<double>(m.ffn_hidden));
  if (m.ffn == "moe") {
    const double shared = m.moe.shared_hidden > 0 ? static_cast<double>(m.moe.shared_hidden)
                                                  : static_cast<double>(m.moe.n_shared * m.moe.expert_hidden);
    const double expert =
        ffn_of(m.moe.activation == Activation::GELU, m.moe.expert_bias, static_cast<double>(m.moe.expert_hidden));
    const double moe =
        static_cast<double>(m.moe.num_experts) * (expert + d) + ffn_of(false, false, shared);  // + router rows
    const double dense = ffn_of(false, false, static_cast<double>(m.ffn_hidden));
    const double moe_layers = static_cast<double>(num_moe_layers(m));
    ffn = L > 0 ? (moe_layers * moe + (L - moe_layers) * dense) / L : 0.0;  // per block, on average
  }
  const int64_t channels = m.stem_channels > 0 ? m.stem_channels : m.channels;
  const double embedding = m.task == "classify" ? static_cast<double>(m.patch_size * m.patch_size * channels) * d
                                                : static_cast<double>(m.vocab_size) * d * (m.tie_embeddings ? 1 : 2);
  return embedding + L * (attention + ffn);
}

}  // namespace mf
