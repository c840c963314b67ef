#include "methods/intb/intb.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

#include "core/config_keys.h"
#include "model/method_info.h"
#include "moe/dispatch.h"
#include "moe/select_rows.h"

namespace mf {
namespace F = torch::nn::functional;

IntBOptions intb_options(const ModelConfig& c) {
  const auto& s = c.moe.section<IntBConfig>();
  IntBOptions o;
  o.blocks = c.moe.num_experts;
  o.top_k = c.moe.top_k;
  o.hidden = c.moe.expert_hidden;
  o.basis = s.basis;
  o.internal_layers = s.internal_layers;
  o.codebook_dim = s.codebook_dim;
  o.hyper_hidden = s.hyper_hidden;
  o.router_hidden = s.router_hidden;
  o.shared_hidden = s.shared_expert ? (s.shared_hidden > 0 ? s.shared_hidden : c.moe.expert_hidden) : 0;
  o.lambda0 = s.lambda0;
  o.gate_path = s.gate_path;
  o.filter = s.filter;
  o.learn_lambda = s.learn_lambda;
  o.softmax_coefficients = s.coefficients == "softmax";
  o.baked = s.baked;
  return o;
}

IntBFeedForward::IntBFeedForward(int64_t d, IntBOptions o, int64_t layer) : opt_(o), d_model_(d), layer_(layer) {
  const int64_t E = o.blocks, A = o.basis, C = o.codebook_dim, R = o.hyper_hidden;
  if (!o.baked) {
    codebook_EC = register_parameter("codebook", torch::empty({E, C}));
    hyper = register_module("hyper", torch::nn::Linear(C, R));
    hyper_norm = register_module("hyper_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({R})));
    value_head = register_module("value_head", torch::nn::Linear(R, A));
    if (o.gate_path) gate_head = register_module("gate_head", torch::nn::Linear(R, A));
  }
  for (int64_t l = 0; l < o.internal_layers; ++l) {
    const int64_t O = layer_width(l + 1), I = layer_width(l);
    if (o.baked) {
      auto reg = [&](const char* what, std::vector<int64_t> shape) {
        return register_parameter(fmt::format("block{}_{}", l, what), torch::zeros(shape));
      };
      baked_.value_EOI.push_back(reg("value_weight", {E, O, I}));
      baked_.value_EO.push_back(reg("value_bias", {E, O}));
      if (o.gate_path) {
        baked_.gate_EOI.push_back(reg("gate_weight", {E, O, I}));
        baked_.gate_EO.push_back(reg("gate_bias", {E, O}));
      }
    } else {
      basis_AOI.push_back(register_parameter(fmt::format("basis{}_weight", l), torch::empty({A, O, I})));
      basis_AO.push_back(register_parameter(fmt::format("basis{}_bias", l), torch::zeros({A, O})));
    }
    if (o.gate_path) gate_norms.push_back(register_module(fmt::format("gate_norm{}", l), RMSNorm(O, 1e-8)));
    if (l + 1 < o.internal_layers)
      layer_norms.push_back(
          register_module(fmt::format("layer_norm{}", l), torch::nn::LayerNorm(torch::nn::LayerNormOptions({O}))));
  }
  router_in = register_module("router_in", torch::nn::Linear(d, o.router_hidden));
  router_out = register_module("router_out", torch::nn::Linear(o.router_hidden, E));
  if (o.filter && o.baked) {  // the x part; the codebook's part and the bias live in the blocks
    filter = register_module("filter", torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false)));
    baked_.filter_ED = register_parameter("filter_blocks", torch::zeros({E, d}));
  } else if (o.filter) {
    filter = register_module("filter", torch::nn::Linear(d + C, d));
  }
  auto l0 = torch::full({1}, o.lambda0);
  lambda = o.learn_lambda ? register_parameter("lambda", l0) : register_buffer("lambda", l0);
  if (o.shared_hidden > 0)
    shared_expert = register_module("shared_expert", std::make_shared<ExpertBank>(1, d, o.shared_hidden));
  // until init_weights runs: the spec's inits from the global generator
  torch::NoGradGuard g;
  if (codebook_EC.defined()) codebook_EC.normal_();
  for (auto& w : basis_AOI) w.uniform_(-1 / std::sqrt(double(w.size(-1))), 1 / std::sqrt(double(w.size(-1))));
}

NamedTensors IntBFeedForward::baked_tensors() const {
  TORCH_CHECK(!opt_.baked, "this IntBMoE slot is baked already");
  torch::NoGradGuard g;
  const auto c = compose();
  NamedTensors out;
  for (auto& p : named_parameters()) {
    const auto& k = p.key();
    const bool pool = k == "codebook" || k.rfind("hyper", 0) == 0 || k.rfind("value_head", 0) == 0 ||
                      k.rfind("gate_head", 0) == 0 || k.rfind("basis", 0) == 0 || k.rfind("filter.", 0) == 0;
    if (!pool) out.emplace_back(k, p.value());
  }
  for (auto& b : named_buffers()) out.emplace_back(b.key(), b.value());
  for (int64_t l = 0; l < opt_.internal_layers; ++l) {
    out.emplace_back(fmt::format("block{}_value_weight", l), c.value_EOI[l]);
    out.emplace_back(fmt::format("block{}_value_bias", l), c.value_EO[l]);
    if (opt_.gate_path) {
      out.emplace_back(fmt::format("block{}_gate_weight", l), c.gate_EOI[l]);
      out.emplace_back(fmt::format("block{}_gate_bias", l), c.gate_EO[l]);
    }
  }
  if (opt_.filter) {
    out.emplace_back("filter.weight", filter->weight.narrow(1, 0, d_model_).contiguous());
    out.emplace_back("filter_blocks", c.filter_ED);
  }
  return out;
}

int64_t IntBFeedForward::layer_width(int64_t l) const {
  return l == 0 || l == opt_.internal_layers ? d_model_ : opt_.hidden;
}

ParamRoleList IntBFeedForward::param_roles() const {
  ParamRoleList r = {{"codebook", ParamRole::UnitNormal},       {"lambda", ParamRole::Scale},
                     {"hyper.weight", ParamRole::FanInUniform}, {"hyper.bias", ParamRole::Bias},
                     {"hyper_norm.weight", ParamRole::Gain},    {"hyper_norm.bias", ParamRole::Bias}};
  for (std::string lin : {"value_head", "gate_head", "router_in", "router_out", "filter"})
    r.insert(r.end(), {{lin + ".weight", ParamRole::FanInUniform}, {lin + ".bias", ParamRole::Bias}});
  for (int64_t l = 0; l < opt_.internal_layers; ++l) {
    r.insert(r.end(), {{fmt::format("basis{}_weight", l), ParamRole::FanInUniform},
                       {fmt::format("basis{}_bias", l), ParamRole::Bias}});
    r.insert(r.end(), {{fmt::format("layer_norm{}.weight", l), ParamRole::Gain},
                       {fmt::format("layer_norm{}.bias", l), ParamRole::Bias}});
  }
  return r;
}

// W_{b,p}^(l) = (1/sqrt(E)) sum_e alpha_{b,e}^p W_e^(l), the same for the biases; the probe
// leaves basis `removed` out (scale 1/sqrt(E-1)); the softmax ablation mixes convexly instead.
ComposedBlocks IntBFeedForward::compose() const {
  if (opt_.baked) return baked_;
  ComposedBlocks c;
  auto lin = [](const torch::nn::Linear& m, const at::Tensor& x) { return F::linear(x, m->weight, m->bias); };
  const auto& n = hyper_norm;
  auto q_ER = torch::relu(F::layer_norm(
      lin(hyper, codebook_EC),
      F::LayerNormFuncOptions({opt_.hyper_hidden}).weight(n->weight).bias(n->bias).eps(n->options.eps())));
  c.alpha_value_EA = lin(value_head, q_ER);
  if (opt_.gate_path) c.alpha_gate_EA = lin(gate_head, q_ER);
  const int64_t E = opt_.blocks, A = opt_.basis, e = opt_.removed_basis;
  auto keep = [&](const at::Tensor& t, int64_t dim) {
    if (e < 0) return t;
    return torch::cat({t.narrow(dim, 0, e), t.narrow(dim, e + 1, A - e - 1)}, dim);
  };
  const double scale = 1 / std::sqrt(static_cast<double>(e < 0 ? A : A - 1));
  auto coefficients = [&](const at::Tensor& a_EA) {
    return opt_.softmax_coefficients ? keep(a_EA, 1).softmax(-1) : keep(a_EA, 1) * scale;
  };
  const auto value_EA = coefficients(c.alpha_value_EA);
  const auto gate_EA = opt_.gate_path ? coefficients(c.alpha_gate_EA) : at::Tensor();
  for (int64_t l = 0; l < opt_.internal_layers; ++l) {
    const auto W_AOI = keep(basis_AOI[l], 0), b_AO = keep(basis_AO[l], 0);
    const int64_t O = W_AOI.size(1), I = W_AOI.size(2), bases = W_AOI.size(0);
    auto mix = [&](const at::Tensor& a_EA) {
      return std::make_pair(a_EA.matmul(W_AOI.reshape({bases, O * I})).view({E, O, I}), a_EA.matmul(b_AO));
    };
    auto [vw, vb] = mix(value_EA);
    c.value_EOI.push_back(vw);
    c.value_EO.push_back(vb);
    if (opt_.gate_path) {
      auto [gw, gb] = mix(gate_EA);
      c.gate_EOI.push_back(gw);
      c.gate_EO.push_back(gb);
    }
  }
  if (opt_.filter)  // the codebook's part of the filter, once per block
    c.filter_ED = F::linear(codebook_EC, filter->weight.narrow(1, d_model_, opt_.codebook_dim), filter->bias);
  return c;
}

const ComposedBlocks& IntBFeedForward::cached_blocks() {
  if (!cache_) cache_ = compose();
  return *cache_;
}

void IntBFeedForward::set_removed_basis(int64_t e) {
  TORCH_CHECK(e >= -1 && e < opt_.basis, "basis ", e, " does not exist (E = ", opt_.basis, ")");
  opt_.removed_basis = e;
  cache_.reset();
}

void IntBFeedForward::train(bool on) {
  cache_.reset();
  FeedForward::train(on);
}

RouterOutput IntBFeedForward::route(const at::Tensor& x_TD) const {
  const auto dtype = x_TD.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // router math in fp32
  auto lin = [&](const torch::nn::Linear& m, const at::Tensor& x) {
    return F::linear(x, m->weight.to(dtype), m->bias.to(dtype));
  };
  auto logits_TE = lin(router_out, torch::relu(lin(router_in, x_TD.to(dtype))));
  auto probs_TE = logits_TE.softmax(-1);
  auto index_TK = top_k_index(logits_TE.detach(), opt_.top_k);
  RouterOutput r;
  auto& a = r.assignment;
  a.num_tokens = x_TD.size(0);
  a.num_units = opt_.blocks;
  a.token_P = torch::arange(a.num_tokens, index_TK.options()).repeat_interleave(opt_.top_k);
  a.unit_P = index_TK.reshape({-1});
  a.weight_P = probs_TE.gather(1, index_TK).reshape({-1});  // softmax over all K, not renormalised
  r.scores_TE = probs_TE;
  return r;
}

torch::Tensor IntBFeedForward::forward(const torch::Tensor& x, AuxLosses& aux) {
  auto x_TD = x.reshape({-1, x.size(-1)});
  std::optional<ComposedBlocks> step;
  const bool infer = !is_training() && !torch::GradMode::is_enabled();
  const ComposedBlocks& blocks = infer ? cached_blocks() : *(step = compose());
  IntBBank bank(*this, blocks);
  const auto routed = route(x_TD);
  auto y_TD = dispatch(x_TD, routed.assignment, bank).y_TD;
  {
    torch::NoGradGuard g;
    last_ = tally_routing(routed);
  }
  if (shared_expert) y_TD = y_TD + shared_expert->forward_unit(0, x_TD);
  return y_TD.view(x.sizes());
}

RoutingStats IntBFeedForward::last_stats() const { return read_routing(last_); }

int64_t IntBBank::num_units() const { return slot_.opt_.blocks; }

at::Tensor IntBBank::per_token(const at::Tensor& x_TD) {
  if (!slot_.opt_.filter) return {};
  return F::linear(x_TD, slot_.filter->weight.narrow(1, 0, slot_.d_model_));  // W_f^x x, once per token
}

// F_b: z0 = x * sigmoid(W_f^x x + W_f^c c_b + b_f); per internal layer v = W_v z + b_v,
// g = RMSNorm(W_g z + b_g), z = v * (1 + lambda SiLU(g)), LayerNorm between layers.
at::Tensor IntBBank::block(int64_t b, const at::Tensor& rows, const at::Tensor& filter_x) {
  const auto& o = slot_.opt_;
  auto z = filter_x.defined() ? rows * torch::sigmoid(filter_x + blocks_.filter_ED[b]) : rows;
  for (int64_t l = 0; l < o.internal_layers; ++l) {
    auto v = F::linear(z, blocks_.value_EOI[l][b], blocks_.value_EO[l][b]);
    if (o.gate_path) {
      auto g = slot_.gate_norms[l]->forward(F::linear(z, blocks_.gate_EOI[l][b], blocks_.gate_EO[l][b]));
      z = v * (1 + slot_.lambda * torch::silu(g));
    } else {
      z = v;
    }
    if (l + 1 < o.internal_layers) z = slot_.layer_norms[l]->forward(z);
  }
  return z;
}

at::Tensor IntBBank::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) {
  return forward_grouped(rows_PD, counts_E, at::Tensor());
}

at::Tensor IntBBank::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E, const at::Tensor& side_PD) {
  const auto counts = counts_E.cpu();
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (int64_t b = 0; b < counts.size(0); ++b) {
    const auto n = counts[b].item<int64_t>();
    if (n == 0) continue;
    out.push_back(block(b, rows_PD.narrow(0, start, n), side_PD.defined() ? side_PD.narrow(0, start, n) : side_PD));
    start += n;
  }
  return out.empty() ? torch::zeros_like(rows_PD) : torch::cat(out);
}

at::Tensor IntBBank::forward_unit(int64_t unit, const at::Tensor& rows) { return block(unit, rows, per_token(rows)); }

namespace {

void validate_intb(const Config& c) {
  const auto& m = c.model;
  if (m.ffn != "intb") return;
  if (m.moe.top_k < 1 || m.moe.top_k > m.moe.num_experts)
    throw ConfigError(fmt::format("model.moe.top_k ({}) must lie in 1..model.moe.num_experts ({}): the blocks K",
                                  m.moe.top_k, m.moe.num_experts));
  in_moe_layers(m, 0);  // a bad model.moe.layers pattern is a ConfigError here
}

}  // namespace

void register_intb() {
  auto ref = [](auto field) {
    return [field](Config & c) -> auto& { return c.model.moe.section<IntBConfig>().*field; };
  };
  register_config_keys({
      key_at<int64_t>("model.moe.intb.basis", ref(&IntBConfig::basis),
                      "IntBMoE (model.ffn = \"intb\"): expert bases E per internal layer, every block composed from "
                      "all of them; the blocks K = model.moe.num_experts, k = model.moe.top_k, internal width = "
                      "model.moe.expert_hidden",
                      1, 4096),
      key_at<int64_t>("model.moe.intb.internal_layers", ref(&IntBConfig::internal_layers),
                      "IntBMoE: internal layers L of a block (d -> expert_hidden -> ... -> d)", 1, 16),
      key_at<int64_t>("model.moe.intb.codebook_dim", ref(&IntBConfig::codebook_dim), "IntBMoE: codebook width", 1,
                      4096),
      key_at<int64_t>("model.moe.intb.hyper_hidden", ref(&IntBConfig::hyper_hidden), "IntBMoE: hypernetwork width d_h",
                      1, 4096),
      key_at<int64_t>("model.moe.intb.router_hidden", ref(&IntBConfig::router_hidden),
                      "IntBMoE: hidden width of the two-layer block router", 1, 65536),
      key_at<double>("model.moe.intb.lambda0", ref(&IntBConfig::lambda0),
                     "IntBMoE: initial DPRG lambda (one learnable scalar per module)", -100, 100),
      key_at<int64_t>("model.moe.intb.shared_hidden", ref(&IntBConfig::shared_hidden),
                      "IntBMoE: width of the always-on shared SwiGLU expert (0 = model.moe.expert_hidden)", 0, 65536),
      key_at<bool>("model.moe.intb.shared_expert", ref(&IntBConfig::shared_expert),
                   "IntBMoE ablation: false drops the shared expert"),
      key_at<bool>("model.moe.intb.gate_path", ref(&IntBConfig::gate_path),
                   "IntBMoE ablation: false drops DPRG's gate path (z = v)"),
      key_at<bool>("model.moe.intb.filter", ref(&IntBConfig::filter),
                   "IntBMoE ablation: false drops the block-conditioned feature filter (z0 = x)"),
      key_at<bool>("model.moe.intb.learn_lambda", ref(&IntBConfig::learn_lambda),
                   "IntBMoE ablation: false keeps lambda fixed at lambda0"),
      key_at<bool>("model.moe.intb.baked", ref(&IntBConfig::baked),
                   "IntBMoE: the blocks are stored composed (written by `moeforge intb-bake`, for serving); no "
                   "codebook, hypernetwork or pools"),
      key_at<std::string>("model.moe.intb.coefficients", ref(&IntBConfig::coefficients),
                          "IntBMoE: recipe coefficients used as they are, scaled 1/sqrt(E) (linear), or a softmax over "
                          "the bases (ablation)",
                          1, 0, {"linear", "softmax"}),
  });
  register_config_validator(validate_intb);
  register_ffn_kind("intb",
                    [](const ModelConfig& c, int64_t layer, const MoEPlan& plan) -> std::shared_ptr<FeedForward> {
                      if (in_moe_layers(c, layer))
                        return std::make_shared<IntBFeedForward>(c.d_model, intb_options(c), layer);
                      ModelConfig dense = c;
                      dense.ffn = c.moe.dense_ffn;
                      return make_feed_forward(dense, layer, plan);
                    });
  MethodInfo info{"intb", "IntBMoE", "IntBMoE routing",
                  "Experts are composed from shared blocks by a recipe per expert."};
  info.enabled = [](const Config& c) { return c.model.ffn == "intb"; };
  info.accounting = [](const Config& c, const FeedForwards& ffns) {
    const auto& m = c.model;
    const int64_t patches = (m.image_size / m.patch_size) * (m.image_size / m.patch_size);
    return intb_accounting(ffns, c.train.batch_size * (m.task == "classify" ? patches + 1 : c.train.seq_len));
  };
  register_method_info(std::move(info));
}

}  // namespace mf
