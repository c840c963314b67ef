// The MoE FFN slot: router -> dispatch -> expert bank (+ shared experts), composed from
// src/moe. Tensor names follow HF: mlp.gate.weight, mlp.experts.{gate_up_proj,down_proj},
// mlp.shared_experts.*.
#pragma once
#include <nlohmann/json.hpp>

#include <torch/nn/modules/linear.h>

#include <functional>
#include <optional>

#include "model/layers.h"
#include "moe/banks.h"
#include "moe/dispatch.h"
#include "moe/pool_balance.h"
#include "moe/routers.h"

namespace mf {

// A UniPool group: one expert bank and balance state shared by the group's MoE layers. The
// group's first layer registers them under its mlp (so the checkpoint stores them once and a
// group of one layer is exactly a vanilla MoE layer); the others hold references.
struct ExpertPool {
  std::shared_ptr<ExpertBank> bank;
  PoolBalance balance{nullptr};  // null without a pool-level loss
  std::vector<int64_t> layers;   // block indices of the group, ascending
};

// The pools of a model (empty unless model.moe.pool_groups > 0); pools[g] serves group g.
std::vector<std::shared_ptr<ExpertPool>> make_expert_pools(const ModelConfig& c);

class MoEFeedForward : public FeedForward {
 public:
  MoEFeedForward(const ModelConfig& c, int64_t layer, std::shared_ptr<ExpertPool> pool = nullptr);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  std::vector<std::string> output_projection_names() const override {
    return {"experts.down_proj", "shared_experts.down_proj", "latent_up.weight"};
  }
  // Aux-loss-free balancing uses the load accumulated since the last call.
  void after_optimizer_step();
  nlohmann::json stats_json() const;  // statistics of the last forward pass
  const RoutingStats& last_stats() const { return last_; }
  const std::shared_ptr<ExpertPool>& pool() const { return pool_; }  // null for private experts

  // Routing-randomization probe: when set, each token's k experts are drawn uniformly (without
  // replacement) from `candidates`; the router's own combine weights are kept.
  struct RandomRouting {
    std::vector<int64_t> candidates;
    uint64_t seed = 0;
  };
  std::optional<RandomRouting> random_routing;

  const MoELayerShape& shape() const { return shape_; }
  // Sees what the routed experts get (latent rows for LatentMoE) and the assignment (diagnostics).
  std::function<void(const at::Tensor& units_input, const Assignment&)> dispatch_hook;

  Router gate{nullptr};
  std::shared_ptr<ExpertBank> experts, shared_experts;
  torch::nn::Linear latent_down{nullptr}, latent_up{nullptr};  // LatentMoE W_down [l, d], W_up [d, l]
  int64_t layer;

 private:
  DispatchOptions dispatch_;
  double loss_scale_;  // 1 / number of MoE layers: the model loss adds the mean over layers
  RoutingStats last_;
  std::vector<int64_t> pending_load_;
  std::shared_ptr<ExpertPool> pool_;
  MoELayerShape shape_;
  int64_t probe_calls_ = 0;
};

// every MoE FFN of a model's blocks, in layer order
std::vector<std::shared_ptr<MoEFeedForward>> moe_layers(const std::vector<std::shared_ptr<FeedForward>>& ffns);

}  // namespace mf
