#include "model/moe_ffn.h"

namespace mf {

static RouterOptions router_options(const MoeConfig& m) {
  RouterOptions o;
  o.kind = m.router, o.num_experts = m.num_experts, o.top_k = m.top_k, o.renormalize = m.renormalize;
  o.top_p = m.top_p, o.aux_loss_coef = m.aux_loss_coef, o.z_loss_coef = m.z_loss_coef, o.bias_update = m.bias_update;
  o.seq_aux_loss_coef = m.seq_aux_loss_coef;
  return o;
}

MoEFeedForward::MoEFeedForward(const ModelConfig& c, int64_t layer_) : layer(layer_) {
  const auto& m = c.moe;
  gate = register_module("gate", Router(c.d_model, router_options(m)));
  experts = register_module("experts", std::make_shared<ExpertBank>(m.num_experts, c.d_model, m.expert_hidden, m.activation,
                                                                       m.expert_bias));
  if (m.n_shared > 0)
    shared_experts = register_module("shared_experts",
                                     std::make_shared<ExpertBank>(1, c.d_model, m.n_shared * m.expert_hidden, "swiglu"));
  dispatch_.capacity_factor = m.capacity_factor;
  int64_t n_moe = 0;
  for (int64_t i = 0; i < c.n_layers; ++i) n_moe += is_moe_layer(c, i);
  loss_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(1, n_moe));
  pending_load_.assign(m.num_experts, 0);
}

torch::Tensor MoEFeedForward::forward(const torch::Tensor& x, AuxLosses& aux) {
  auto flat = x.reshape({-1, x.size(-1)});
  gate->set_sequence_length(x.dim() == 3 ? x.size(1) : flat.size(0));
  auto routed = gate->forward(flat);
  auto result = dispatch(flat, routed.assignment, *experts, dispatch_);
  auto y = result.output;
  if (shared_experts) y = y + shared_experts->forward_unit(0, flat);
  for (auto& [name, v] : routed.losses) aux.add(fmt::format("moe{}.{}", layer, name), v * loss_scale_);
  {
    torch::NoGradGuard g;
    last_ = routing_stats(routed);
    last_.dropped = result.dropped;
    // only training batches drive the balancing bias (evaluation must not change training)
    if (is_training())
      for (size_t e = 0; e < last_.load.size(); ++e) pending_load_[e] += last_.load[e];
  }
  return y.view(x.sizes());
}

void MoEFeedForward::after_optimizer_step() {
  gate->update_selection_bias(pending_load_);
  std::fill(pending_load_.begin(), pending_load_.end(), 0);
}

nlohmann::json MoEFeedForward::stats_json() const {
  nlohmann::json j = {{"layer", layer}, {"load", last_.load}, {"cv", last_.cv()}, {"max_over_mean", last_.max_over_mean()},
                      {"entropy", last_.entropy}, {"dead", last_.dead_units()},
                      {"units_per_token", last_.mean_units_per_token}, {"dropped", last_.dropped}};
  if (!last_.load.empty()) {
    j["load_min"] = *std::min_element(last_.load.begin(), last_.load.end());
    j["load_max"] = *std::max_element(last_.load.begin(), last_.load.end());
  }
  for (auto& [name, v] : last_.losses) j[name] = v;
  return j;
}

std::vector<std::shared_ptr<MoEFeedForward>> moe_layers(const std::vector<std::shared_ptr<FeedForward>>& ffns) {
  std::vector<std::shared_ptr<MoEFeedForward>> out;
  for (auto& f : ffns)
    if (auto m = std::dynamic_pointer_cast<MoEFeedForward>(f)) out.push_back(m);
  return out;
}

}  // namespace mf
