#include "model/moe_ffn.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace mf {

static RouterOptions router_options(const ModelConfig& c, const MoELayerShape& shape) {
  const auto& m = c.moe;
  RouterOptions o;
  o.kind = m.router, o.num_experts = shape.num_experts, o.top_k = shape.top_k;
  o.renormalize = m.router == "norm_topk" ? m.norm_renormalize : m.renormalize;
  o.top_p = m.top_p, o.aux_loss_coef = m.aux_loss_coef, o.z_loss_coef = m.z_loss_coef, o.bias_update = m.bias_update;
  o.seq_aux_loss_coef = m.seq_aux_loss_coef, o.norm_eps = m.norm_eps;
  return o;
}

std::vector<std::shared_ptr<ExpertPool>> make_expert_pools(const ModelConfig& c) {
  std::vector<std::shared_ptr<ExpertPool>> pools;
  const auto& m = c.moe;
  if (c.ffn != "moe" || m.pool_groups == 0) return pools;
  std::vector<int64_t> moe;
  for (int64_t i = 0; i < c.n_layers; ++i)
    if (is_moe_layer(c, i)) moe.push_back(i);
  const int64_t per_group = static_cast<int64_t>(moe.size()) / m.pool_groups, E = routed_experts(c);
  for (int64_t g = 0; g < m.pool_groups; ++g) {
    auto p = std::make_shared<ExpertPool>();
    p->bank = std::make_shared<ExpertBank>(E, c.d_model, m.expert_hidden, m.activation, m.expert_bias);
    if (m.pool_aux_loss_coef > 0) p->balance = PoolBalance(E, per_group, m.pool_aux_loss_coef);
    p->layers.assign(moe.begin() + g * per_group, moe.begin() + (g + 1) * per_group);
    pools.push_back(p);
  }
  return pools;
}

MoEFeedForward::MoEFeedForward(const ModelConfig& c, int64_t layer_, std::shared_ptr<ExpertPool> pool)
    : layer(layer_), pool_(std::move(pool)) {
  const auto& m = c.moe;
  shape_ = moe_layer_shape(c, layer);
  gate = register_module("gate", Router(c.d_model, router_options(c, shape_)));
  const int64_t width = shape_.latent > 0 ? shape_.latent : c.d_model;  // where the routed experts work
  if (shape_.latent > 0) {
    using torch::nn::LinearOptions;
    latent_down = register_module("latent_down", torch::nn::Linear(LinearOptions(c.d_model, width).bias(false)));
    latent_up = register_module("latent_up", torch::nn::Linear(LinearOptions(width, c.d_model).bias(false)));
  }
  if (!pool_) {
    experts = register_module("experts", std::make_shared<ExpertBank>(shape_.num_experts, width, shape_.expert_hidden,
                                                                         m.activation, m.expert_bias));
  } else {
    experts = pool_->bank;
    if (pool_->layers.front() == layer) {
      register_module("experts", experts);
      if (pool_->balance) register_module("pool_balance", pool_->balance);
    }
  }
  if (shape_.shared_hidden > 0)
    shared_experts = register_module("shared_experts", std::make_shared<ExpertBank>(1, c.d_model, shape_.shared_hidden, "swiglu"));
  dispatch_.capacity_factor = m.capacity_factor;
  loss_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(1, num_moe_layers(c)));
  pending_load_.assign(experts->num_units(), 0);
}

// Probe: k distinct units per token, uniform over the candidates (the router's weights kept).
// The draw is the engine's uniform_random router over candidate slots, mapped to expert ids.
static at::Tensor random_units(const MoEFeedForward::RandomRouting& r, int64_t tokens, int64_t k, uint64_t seed) {
  const auto n = static_cast<int64_t>(r.candidates.size());
  TORCH_CHECK(n >= k, "random routing: ", n, " candidate experts for top-", k);
  RouterOptions o;
  o.kind = "uniform_random", o.num_experts = n, o.top_k = k, o.seed = seed, o.aux_loss_coef = 0, o.z_loss_coef = 0;
  RouterImpl draw(1, o);
  auto slots = draw.forward(torch::zeros({tokens, 1})).assignment.unit;
  return torch::tensor(r.candidates, torch::kLong).index_select(0, slots);
}

torch::Tensor MoEFeedForward::forward(const torch::Tensor& x, AuxLosses& aux) {
  auto flat = x.reshape({-1, x.size(-1)});
  gate->set_sequence_length(x.dim() == 3 ? x.size(1) : flat.size(0));
  auto routed = gate->forward(flat);
  auto& a = routed.assignment;
  if (random_routing) {
    const int64_t k = a.unit.numel() / std::max<int64_t>(1, a.num_tokens);
    a.unit = random_units(*random_routing, a.num_tokens, k, random_routing->seed + static_cast<uint64_t>(probe_calls_++));
  }
  if (pool_ && pool_->balance) {
    const bool record = is_training() && torch::GradMode::is_enabled();
    if (auto l = pool_->balance->layer_loss(routed.scores, a.unit, record); l.defined())
      routed.losses.emplace_back("pool_aux", l);
  }
  // LatentMoE: route on x, dispatch and combine in the latent space, project back up
  auto units_in = latent_down ? latent_down->forward(flat) : flat;
  if (dispatch_hook) dispatch_hook(units_in, a);
  auto result = dispatch(units_in, a, *experts, dispatch_);
  auto y = latent_up ? latent_up->forward(result.output) : result.output;
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
  if (gate->norm_scale.defined()) j["norm_scale"] = gate->norm_scale.item<double>();
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
