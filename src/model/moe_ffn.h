// The MoE FFN slot: router -> dispatch -> expert bank (+ shared experts), composed from
// src/moe. Tensor names follow HF: mlp.gate.weight, mlp.experts.{gate_up_proj,down_proj},
// mlp.shared_experts.*.
#pragma once
#include <nlohmann/json.hpp>

#include "model/layers.h"
#include "moe/banks.h"
#include "moe/dispatch.h"
#include "moe/routers.h"

namespace mf {

class MoEFeedForward : public FeedForward {
 public:
  MoEFeedForward(const ModelConfig& c, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  std::vector<std::string> output_projection_names() const override {
    return {"experts.down_proj", "shared_experts.down_proj"};
  }
  // Aux-loss-free balancing uses the load accumulated since the last call.
  void after_optimizer_step();
  nlohmann::json stats_json() const;  // statistics of the last forward pass

  Router gate{nullptr};
  std::shared_ptr<ExpertBank> experts, shared_experts;
  int64_t layer;

 private:
  DispatchOptions dispatch_;
  double loss_scale_;  // 1 / number of MoE layers: the model loss adds the mean over layers
  RoutingStats last_;
  std::vector<int64_t> pending_load_;
};

// every MoE FFN of a model's blocks, in layer order
std::vector<std::shared_ptr<MoEFeedForward>> moe_layers(const std::vector<std::shared_ptr<FeedForward>>& ffns);

}  // namespace mf
