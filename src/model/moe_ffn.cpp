#include "model/moe_ffn.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

namespace mf {
namespace {

std::vector<std::pair<std::string, MoEExtensionFactory>>& extension_registry() {
  static std::vector<std::pair<std::string, MoEExtensionFactory>> r;
  return r;
}

RouterOptions router_options(const ModelConfig& c, const MoELayerShape& shape) {
  const auto& m = c.moe;
  RouterOptions o;
  o.kind = m.router;
  o.num_experts = shape.num_experts;
  o.top_k = shape.top_k;
  o.renormalize = m.router == RouterKind::NormTopK ? m.norm_renormalize : m.renormalize;
  o.top_p = m.top_p;
  o.aux_loss_coef = m.aux_loss_coef;
  o.z_loss_coef = m.z_loss_coef;
  o.bias_update = m.bias_update;
  o.seq_aux_loss_coef = m.seq_aux_loss_coef;
  o.norm_eps = m.norm_eps;
  o.gate_scale = m.gate_scale;
  return o;
}

// Probe: k distinct units per token, uniform over the candidates, drawn by the engine's
// uniform_random router over candidate slots and mapped to expert ids.
at::Tensor random_units(const MoEFeedForward::RandomRouting& r, int64_t tokens, int64_t k, uint64_t seed,
                        const at::Tensor& like) {
  const auto n = static_cast<int64_t>(r.candidates.size());
  TORCH_CHECK(n >= k, "random routing: ", n, " candidate experts for top-", k);
  RouterOptions o;
  o.kind = RouterKind::UniformRandom;
  o.num_experts = n;
  o.top_k = k;
  o.seed = seed;
  o.aux_loss_coef = 0;
  o.z_loss_coef = 0;
  RouterImpl draw(1, o);
  auto slots_P = draw.forward(torch::zeros({tokens, 1})).assignment.unit_P;
  return torch::tensor(r.candidates, torch::kLong).index_select(0, slots_P).to(like.device());
}

}  // namespace

void register_moe_extension(const std::string& name, MoEExtensionFactory make) {
  auto& r = extension_registry();
  for (auto& [n, f] : r)
    if (n == name) return;  // registering twice is harmless
  r.emplace_back(name, std::move(make));
}

MoEPlan plan_moe(const ModelConfig& c) {
  MoEPlan plan;
  const auto& m = c.moe;
  for (int64_t i = 0; i < c.n_layers; ++i)
    if (is_moe_layer(c, i))
      plan.shapes[i] = {0,
                        m.expert_hidden,
                        m.num_experts,
                        m.top_k,
                        m.shared_hidden > 0 ? m.shared_hidden : m.n_shared * m.expert_hidden,
                        m.num_experts};
  for (auto& [name, make] : extension_registry())
    if (auto ext = make(c)) plan.extensions.push_back(ext);
  for (auto& ext : plan.extensions) ext->plan(plan.shapes);
  for (auto& [layer, s] : plan.shapes)
    if (s.top_k > s.num_experts)
      throw ConfigError(
          fmt::format("MoE block {}: top-k {} exceeds the {} experts its router chooses among "
                      "(model.moe.top_k / model.moe.num_experts, or a method's shape keys)",
                      layer, s.top_k, s.num_experts));
  return plan;
}

MoEFeedForward::MoEFeedForward(const ModelConfig& c, int64_t layer_, const MoEPlan& plan)
    : layer(layer_), extensions_(plan.extensions), d_model_(c.d_model) {
  const auto& m = c.moe;
  shape_ = plan.shapes.at(layer);
  gate = register_module("gate", Router(c.d_model, router_options(c, shape_)));
  for (auto& ext : extensions_) ext->attach(*this);
  if (!experts)
    experts = register_module("experts", std::make_shared<ExpertBank>(shape_.num_experts, width(), shape_.expert_hidden,
                                                                      m.activation, m.expert_bias));
  if (shape_.shared_hidden > 0)
    shared_experts =
        register_module("shared_experts", std::make_shared<ExpertBank>(1, c.d_model, shape_.shared_hidden));
  if (shared_experts && m.shared_gate)
    shared_gate = register_module("shared_gate", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, 1).bias(false)));
  dispatch_.capacity_factor = m.capacity_factor;
  loss_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(1, num_moe_layers(c)));
}

torch::Tensor MoEFeedForward::forward(const torch::Tensor& x, AuxLosses& aux) {
  auto x_TD = x.reshape({-1, x.size(-1)});
  const bool record = is_training() && torch::GradMode::is_enabled();
  RouterOutput routed;
  at::Tensor y_TD, dropped;
  for (auto& ext : extensions_)
    if ((y_TD = ext->forward_routed(*this, x_TD, routed, record)).defined()) break;
  if (!y_TD.defined()) std::tie(y_TD, dropped) = forward_experts(x, x_TD, routed, record);
  if (shared_experts) {
    auto s_TD = shared_experts->forward_unit(0, x_TD);
    if (shared_gate) s_TD = s_TD * torch::sigmoid(shared_gate->forward(x_TD));
    y_TD = y_TD + s_TD;
  }
  for (auto& [name, v] : routed.losses) aux.add(fmt::format("moe{}.{}", layer, name), v * loss_scale_);
  {
    torch::NoGradGuard g;
    last_ = tally_routing(routed);
    if (dropped.defined()) last_.dropped = dropped;
    // only training batches drive the balancing bias (evaluation must not change training)
    if (is_training() && gate->options().bias_update > 0)
      pending_load_E_ = pending_load_E_.defined() ? pending_load_E_ + last_.load_E : last_.load_E;
  }
  return y_TD.view(x.sizes());
}

std::pair<at::Tensor, at::Tensor> MoEFeedForward::forward_experts(const at::Tensor& x, const at::Tensor& x_TD,
                                                                  RouterOutput& routed, bool record) {
  gate->set_sequence_length(x.dim() == 3 ? x.size(1) : x_TD.size(0));
  routed = gate->forward(x_TD);
  auto& a = routed.assignment;
  if (random_routing) {
    const int64_t k = a.unit_P.numel() / std::max<int64_t>(1, a.num_tokens);
    const auto seed = random_routing->seed + static_cast<uint64_t>(probe_calls_++);
    a.unit_P = random_units(*random_routing, a.num_tokens, k, seed, a.unit_P);
  }
  for (auto& ext : extensions_) ext->routed(*this, routed, record);
  auto units_in = x_TD;
  for (auto& ext : extensions_) units_in = ext->units_input(*this, units_in);
  if (dispatch_hook) dispatch_hook(units_in, routed);
  auto result = dispatch(units_in, a, dispatch_bank ? *dispatch_bank : *experts, dispatch_);
  auto y_TD = result.y_TD;
  for (auto it = extensions_.rbegin(); it != extensions_.rend(); ++it) y_TD = (*it)->units_output(*this, y_TD);
  return {y_TD, result.dropped};
}

void MoEFeedForward::after_optimizer_step() {
  gate->update_selection_bias(pending_load_E_);
  pending_load_E_ = at::Tensor();
}

RoutingStats MoEFeedForward::last_stats() const { return read_routing(last_); }

nlohmann::json routing_stats_json(int64_t layer, const RoutingStats& s) {
  nlohmann::json j = {{"layer", layer},
                      {"load", s.load},
                      {"cv", s.cv()},
                      {"max_over_mean", s.max_over_mean()},
                      {"entropy", s.entropy},
                      {"dead", s.dead_units()},
                      {"units_per_token", s.mean_units_per_token},
                      {"dropped", s.dropped}};
  if (!s.load.empty()) {
    j["load_min"] = *std::min_element(s.load.begin(), s.load.end());
    j["load_max"] = *std::max_element(s.load.begin(), s.load.end());
  }
  for (auto& c : s.counts) {
    j[c.name + "_mean"] = c.mean;
    j[c.name + "_hist"] = c.histogram;
  }
  for (auto& [name, v] : s.losses) j[name] = v;
  return j;
}

nlohmann::json MoEFeedForward::stats_json() const {
  auto j = routing_stats_json(layer, last_stats());
  if (gate->norm_scale.defined()) j["norm_scale"] = gate->norm_scale.item<double>();
  if (gate->gate_scale.defined()) j["gate_scale"] = gate->gate_scale.item<double>();
  return j;
}

std::vector<ReportsRouting*> routing_slots(const std::vector<std::shared_ptr<FeedForward>>& ffns) {
  std::vector<ReportsRouting*> out;
  for (auto& f : ffns)
    if (auto* r = dynamic_cast<ReportsRouting*>(f.get())) out.push_back(r);
  return out;
}

bool MoEFeedForward::dispatches_whole_experts() const {
  return std::all_of(extensions_.begin(), extensions_.end(),
                     [](const auto& e) { return e->dispatches_whole_experts(); });
}

std::vector<std::shared_ptr<MoEFeedForward>> moe_layers(const std::vector<std::shared_ptr<FeedForward>>& ffns) {
  std::vector<std::shared_ptr<MoEFeedForward>> out;
  for (auto& f : ffns)
    if (auto m = std::dynamic_pointer_cast<MoEFeedForward>(f)) out.push_back(m);
  return out;
}

}  // namespace mf
