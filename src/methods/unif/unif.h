// UniF-MoE (arXiv 2608.10392, ../shared/specs/unifmoe.md) as an MoE extension: every MoE
// block becomes a shared expert + model.moe.num_experts residual experts (one bank of K + 1
// experts, expert 0 shared), routed by route.h over (expert, block) units.
#pragma once
#include "core/config.h"
#include "methods/unif/route.h"
#include "model/moe_ffn.h"

namespace mf {

// [model.moe.unif]
struct UniFConfig : MethodSectionOf<UniFConfig> {
  int64_t blocks = 0;                      // B (0 = off); must divide model.moe.expert_hidden
  double div_loss_coef = 0.01;             // lambda_div of ||W*^T W* - I||_F
  double fixed_alpha = 0;                  // ablation: a constant alpha (the paper's 0.4); 0 = adaptive
  int64_t residual_top_k = 0;              // ablation: top-n residual experts (the paper's 2); 0 = cumulative mass
  std::string block_select = "prototype";  // prototype | prefix (ablation)
};

UniFOptions unif_options(const UniFConfig& c);

// mu_b for every block: the mean over block b's channels of the shared expert's keys (the
// rows of gate_up[0] that feed the activation: fc1 for GELU, the gate rows for SwiGLU) -> [B, D]
at::Tensor unif_prototypes(const ExpertBank& bank, int64_t blocks);

// Per-token cost of the routed units: parameters and multiply-add FLOPs (2 per weight) of one
// (expert, block) unit, output biases excluded (an active expert adds D of them).
struct UniFUnitCost {
  int64_t params = 0, flops = 0;
};
UniFUnitCost unif_unit_cost(const ExpertBank& bank, int64_t blocks);
// `info`: the cost per token of the fewest, most and top-2-equivalent activated blocks
nlohmann::json unif_accounting(const Config& c, const std::vector<std::shared_ptr<FeedForward>>& ffns);

class UniFExtension : public MoEExtension {
 public:
  explicit UniFExtension(const ModelConfig& c);
  void plan(std::map<int64_t, MoELayerShape>& shapes) override;
  void attach(MoEFeedForward& slot) override;
  at::Tensor forward_routed(MoEFeedForward& slot, const at::Tensor& x_TD, RouterOutput& routed, bool record) override;
  bool dispatches_whole_experts() const override { return false; }

 private:
  UniFOptions options_;
  double div_loss_coef_;
};

// Registers the [model.moe.unif] keys, their validation and the MoE extension.
void register_unif();

}  // namespace mf
