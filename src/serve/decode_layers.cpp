#include "serve/decode_layers.h"

#include "moe/banks.h"

namespace mf::decoding {
namespace {

Unit bank_unit(const ExpertBank& bank, int64_t e) {
  const int64_t F = bank.expert_hidden();
  const auto gate_up = bank.gate_up_proj.select(0, e);
  const auto bias = bank.gate_up_proj_bias.defined() ? bank.gate_up_proj_bias.select(0, e) : at::Tensor();
  auto rows = [&](const at::Tensor& t, int64_t r0) { return t.defined() ? t.narrow(0, r0, F) : at::Tensor(); };
  Unit u;
  u.gate = matrix(rows(gate_up, 0), rows(bias, 0));
  if (bank.activation() == Activation::SwiGLU) u.up = matrix(rows(gate_up, F), rows(bias, F));
  u.down = matrix(bank.down_proj.select(0, e),
                  bank.down_proj_bias.defined() ? bank.down_proj_bias.select(0, e) : at::Tensor());
  return u;
}

}  // namespace

std::string moe_unsupported(const MoEFeedForward& f) {
  if (f.extended()) return "a method's extension of its MoE slot";
  if (f.random_routing || f.dispatch_hook || f.dispatch_bank) return "a probe or expert parallelism on its MoE slot";
  if (f.capacity_factor() > 0) return "an expert capacity limit (model.moe.capacity_factor)";
  const auto kind = f.gate->options().kind;
  if (kind != RouterKind::SoftmaxTopK && kind != RouterKind::SigmoidTopK && kind != RouterKind::NormTopK)
    return "the " + to_string(kind) + " router";
  return "";
}

Layer dense_layer(FeedForward& ffn) {
  Layer l;
  if (auto* s = dynamic_cast<SwiGLU*>(&ffn))
    l.units.push_back({matrix(s->gate_proj->weight), matrix(s->up_proj->weight), matrix(s->down_proj->weight)});
  else if (auto* g = dynamic_cast<GeluMLP*>(&ffn))
    l.units.push_back({matrix(g->fc1->weight, g->fc1->bias), Matrix{}, matrix(g->fc2->weight, g->fc2->bias)});
  return l;
}

Layer moe_layer(MoEFeedForward& f) {
  Layer l;
  l.moe = true;
  for (int64_t e = 0; e < f.experts->num_units(); ++e) l.units.push_back(bank_unit(*f.experts, e));
  if (f.shared_experts) l.shared = bank_unit(*f.shared_experts, 0);
  if (f.shared_gate) l.shared_gate = matrix(f.shared_gate->weight);
  auto& g = *f.gate;
  const auto& o = g.options();
  Router& r = l.router;
  r.w = matrix(g.weight);
  r.kind = o.kind;
  r.top_k = o.top_k;
  r.renormalize = o.renormalize;
  if (o.bias_update > 0) r.selection_bias = floats(g.selection_bias);
  if (g.norm_scale.defined()) r.norm_factor = static_cast<float>(g.norm_scale.item<double>() * g.norm_constant);
  r.norm_eps = o.norm_eps;
  if (g.gate_scale.defined()) r.scale = static_cast<float>(g.gate_scale.item<double>());
  return l;
}

}  // namespace mf::decoding
