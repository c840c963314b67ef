// UniPool (arXiv 2605.06665, ../shared/specs/unipool.md): MoE layers split into G contiguous
// groups, each routing into one shared expert pool with its own router; NormRouter (the
// engine's norm_topk router) and the one-step-behind pool-level balance loss.
#pragma once
#include "core/config.h"
#include "methods/unipool/pool_balance.h"
#include "model/moe_ffn.h"

namespace mf {

// [model.moe.unipool]
struct UniPoolConfig : MethodSectionOf<UniPoolConfig> {
  int64_t groups = 0;          // G; 0 = every layer owns its experts; G = #MoE layers is vanilla MoE
  int64_t pool_size = 0;       // total pool experts M over all groups (0 = the vanilla budget)
  double aux_loss_coef = 0.0;  // pool-level balance loss alpha_pool (1e-2 in the paper; 0 = off)
};

// One group: its MoE blocks (ascending), the bank they share and its balance state. The
// group's first block registers both, so a checkpoint stores them once under its mlp.
struct ExpertPool {
  std::vector<int64_t> layers;
  int64_t size = 0;  // M / G experts
  std::shared_ptr<ExpertBank> bank;
  PoolBalance balance{nullptr};  // null without a pool-level loss
};

class UniPoolExtension : public MoEExtension {
 public:
  explicit UniPoolExtension(const ModelConfig& c) : config_(c) {}
  void plan(std::map<int64_t, MoELayerShape>& shapes) override;
  void attach(MoEFeedForward& slot) override;
  void routed(MoEFeedForward& slot, RouterOutput& routed, bool record) override;
  const std::vector<ExpertPool>& pools() const { return pools_; }

 private:
  ModelConfig config_;
  std::vector<ExpertPool> pools_;
};

// Registers the [model.moe.unipool] keys (and the old flat model.moe.pool_* names), their
// validation and the MoE extension.
void register_unipool();

}  // namespace mf
