// The MoE FFN slot: router -> dispatch -> expert bank (+ shared experts), composed from
// src/moe. Methods plug in through MoEExtension (registered by name, made per model when the
// config enables them): they may reshape layers, hand a layer a shared bank, wrap the routed
// path (e.g. a latent projection) and add losses. The slot knows no paper.
// Tensor names follow HF: mlp.gate.weight, mlp.experts.{gate_up_proj,down_proj}, mlp.shared_experts.*.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>

#include "model/layers.h"
#include "moe/banks.h"
#include "moe/dispatch.h"
#include "moe/routers.h"

namespace mf {

// The resolved shape of one MoE layer.
struct MoELayerShape {
  int64_t latent = 0;  // l; 0 = routed experts work on the full width D
  int64_t expert_hidden = 0, num_experts = 0, top_k = 0;
  int64_t shared_hidden = 0;    // width of the full-width shared SwiGLU expert (0 = none)
  int64_t vanilla_experts = 0;  // experts a private layer of this shape would store (accounting)
  bool operator==(const MoELayerShape& o) const {
    return latent == o.latent && expert_hidden == o.expert_hidden && num_experts == o.num_experts && top_k == o.top_k &&
           shared_hidden == o.shared_hidden;
  }
};

class MoEFeedForward;

// The common fields: layer, load, cv, max/mean, entropy, dead units, units per token, dropped,
// losses and per-token count histograms.
nlohmann::json routing_stats_json(int64_t layer, const RoutingStats& s);

// An FFN slot that routes tokens and reports its routing statistics per logging step (the
// trainer's "moe" records): the MoE slot, and method slots that route on their own (IntBMoE).
class ReportsRouting {
 public:
  virtual ~ReportsRouting() = default;
  virtual RoutingStats last_stats() const = 0;  // of the last forward pass (reads the device once)
  virtual nlohmann::json stats_json() const { return routing_stats_json(routing_layer(), last_stats()); }
  virtual int64_t routing_layer() const = 0;            // block index
  virtual int64_t routed_units() const = 0;             // experts (or blocks) a token can be sent to
  virtual int64_t routing_group() const { return -1; }  // shared pool routed into (-1: the slot's own units)
};

class MoEExtension {
 public:
  virtual ~MoEExtension() = default;
  // Sees every MoE block's shape (block index -> shape) before any slot is built; may change them.
  virtual void plan(std::map<int64_t, MoELayerShape>& shapes) {}
  // Runs in the slot's constructor after the router, before the slot makes a private bank:
  // may register modules on the slot or set slot.experts to a shared bank.
  virtual void attach(MoEFeedForward& slot) {}
  // The routed path: x_TD -> what the units see; their combined output -> the residual width.
  virtual at::Tensor units_input(const MoEFeedForward& slot, const at::Tensor& x_TD) { return x_TD; }
  virtual at::Tensor units_output(const MoEFeedForward& slot, const at::Tensor& y) { return y; }
  // After routing: add losses to `routed.losses` (`record`: training with gradients).
  virtual void routed(MoEFeedForward& slot, RouterOutput& routed, bool record) {}
  // Replaces the slot's router -> dispatch path (a method whose units are not whole experts,
  // e.g. UniF-MoE's (expert, block) pairs): returns the routed output at full width and fills
  // `routed` (assignment, scores, losses, per-token counts) for the slot to tally. An
  // undefined tensor leaves the slot's own path.
  virtual at::Tensor forward_routed(MoEFeedForward& slot, const at::Tensor& x_TD, RouterOutput& routed, bool record) {
    return {};
  }
  // false when forward_routed may replace the path: the slot's bank is then not only reached
  // through dispatch_bank (expert parallelism leaves such slots whole)
  virtual bool dispatches_whole_experts() const { return true; }
};
// Returns null when the config does not enable the method.
using MoEExtensionFactory = std::function<std::shared_ptr<MoEExtension>(const ModelConfig&)>;
void register_moe_extension(const std::string& name, MoEExtensionFactory make);

// The MoE blocks' shapes and the enabled extensions of one model (throws ConfigError).
struct MoEPlan {
  std::map<int64_t, MoELayerShape> shapes;
  std::vector<std::shared_ptr<MoEExtension>> extensions;
};
MoEPlan plan_moe(const ModelConfig& c);

class MoEFeedForward : public FeedForward, public ReportsRouting {
 public:
  MoEFeedForward(const ModelConfig& c, int64_t layer, const MoEPlan& plan);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  // Aux-loss-free balancing uses the load accumulated since the last call.
  void after_optimizer_step();
  // That load [E] (undefined when not balancing); data parallel sums it over ranks in place first.
  at::Tensor& pending_load() { return pending_load_E_; }
  nlohmann::json stats_json() const override;
  RoutingStats last_stats() const override;
  int64_t routing_layer() const override { return layer; }
  int64_t routed_units() const override { return experts->num_units(); }
  int64_t routing_group() const override { return bank_group; }
  const MoELayerShape& shape() const { return shape_; }
  bool dispatches_whole_experts() const;  // every extension does (MoEExtension::dispatches_whole_experts)
  bool extended() const { return !extensions_.empty(); }                          // a method's extension is enabled
  double capacity_factor() const { return dispatch_.capacity_factor; }            // > 0: pairs per unit capped
  int64_t width() const { return shape_.latent > 0 ? shape_.latent : d_model_; }  // where the routed units work

  // Routing-randomization probe: when set, each token's k experts are drawn uniformly (without
  // replacement) from `candidates` by the engine's uniform_random router; the combine weights are kept.
  struct RandomRouting {
    std::vector<int64_t> candidates;
    uint64_t seed = 0;
  };
  std::optional<RandomRouting> random_routing;
  // Sees what the routed experts get (latent rows for LatentMoE) and the router's output
  // (assignment, scores) before dispatch (diagnostics, saliency).
  std::function<void(const at::Tensor& units_input, const RouterOutput& routed)> dispatch_hook;

  Router gate{nullptr};
  std::shared_ptr<ExpertBank> experts, shared_experts;
  // Where dispatch sends the routed pairs when set (not a registered module: it computes with
  // `experts`' parameters); dist/ sets an expert-parallel wrapper. Null = `experts` itself.
  std::shared_ptr<UnitBank> dispatch_bank;
  torch::nn::Linear shared_gate{nullptr};  // model.moe.shared_gate: w [1, D]
  int64_t layer;
  int64_t bank_group = -1;  // index of the shared bank this layer routes into (-1: its own experts)

 private:
  // router -> dispatch -> expert bank (the path every method but a forward_routed one takes): y_TD, dropped
  std::pair<at::Tensor, at::Tensor> forward_experts(const at::Tensor& x, const at::Tensor& x_TD, RouterOutput& routed,
                                                    bool record);
  std::vector<std::shared_ptr<MoEExtension>> extensions_;
  DispatchOptions dispatch_;
  double loss_scale_;  // 1 / number of MoE layers: the model loss adds the mean over layers
  RoutingTally last_;
  at::Tensor pending_load_E_;
  MoELayerShape shape_;
  int64_t d_model_;
  int64_t probe_calls_ = 0;
};

// every MoE FFN of a model's blocks, in layer order
std::vector<std::shared_ptr<MoEFeedForward>> moe_layers(const std::vector<std::shared_ptr<FeedForward>>& ffns);
// every slot that reports routing (MoE and method slots), in layer order
std::vector<ReportsRouting*> routing_slots(const std::vector<std::shared_ptr<FeedForward>>& ffns);

}  // namespace mf
