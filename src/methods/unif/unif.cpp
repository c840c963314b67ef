#include "methods/unif/unif.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/config_keys.h"
#include "io/upcycle.h"
#include "model/method_info.h"

namespace mf {

UniFOptions unif_options(const UniFConfig& c) {
  UniFOptions o;
  o.blocks = c.blocks;
  o.fixed_alpha = c.fixed_alpha;
  o.residual_top_k = c.residual_top_k;
  o.prefix_blocks = c.block_select == "prefix";
  return o;
}

at::Tensor unif_prototypes(const ExpertBank& bank, int64_t blocks) {
  const int64_t F = bank.expert_hidden();
  auto keys_FD = bank.gate_up_proj[0].narrow(0, 0, F);  // GELU: fc1; SwiGLU: the gate rows
  return keys_FD.reshape({blocks, F / blocks, keys_FD.size(1)}).mean(1);
}

UniFUnitCost unif_unit_cost(const ExpertBank& bank, int64_t blocks) {
  const int64_t weights = (bank.gate_up_proj[0].numel() + bank.down_proj[0].numel()) / blocks;
  const int64_t biases = bank.gate_up_proj_bias.defined() ? bank.gate_up_proj_bias[0].numel() / blocks : 0;
  return {weights + biases, 2 * weights};
}

UniFExtension::UniFExtension(const ModelConfig& c)
    : options_(unif_options(c.moe.section<UniFConfig>())), div_loss_coef_(c.moe.section<UniFConfig>().div_loss_coef) {}

void UniFExtension::plan(std::map<int64_t, MoELayerShape>& shapes) {
  for (auto& [layer, s] : shapes) {
    s.num_experts += 1;       // the shared expert is expert 0 of the bank
    s.top_k = s.num_experts;  // a token may touch every expert (in part): the upper bound of the accounting
    s.vanilla_experts = s.num_experts;
  }
}

void UniFExtension::attach(MoEFeedForward& slot) { slot.gate->orthonormal_init = true; }

at::Tensor UniFExtension::forward_routed(MoEFeedForward& slot, const at::Tensor& x_TD, RouterOutput& routed,
                                         bool record) {
  if (slot.random_routing || slot.dispatch_hook)  // a plain exception: one line for the user, no LibTorch trace
    throw std::invalid_argument(
        "the routing probe, the Jacobian analysis and diagnose work on whole experts; UniF-MoE layers route "
        "(expert, block) units and are not supported by them");
  const int64_t B = options_.blocks, K = slot.experts->num_units() - 1;
  auto x = x_TD.scalar_type() == at::kDouble ? x_TD : x_TD.to(at::kFloat);  // router math in float32 at least
  // one pass over x for the router and the block priorities x . mu_b: an [T, D] x [D, 7 + 8]
  // product costs OpenBLAS about what each narrow one does alone
  auto w_JD = slot.gate->weight.to(x.scalar_type());
  const int64_t J = w_JD.size(0);
  if (!options_.prefix_blocks) {
    at::Tensor mu_GD;
    {
      torch::NoGradGuard no_grad;  // the block choice is discrete: no gradient through mu
      mu_GD = unif_prototypes(*slot.experts, B).to(x.scalar_type());
    }
    w_JD = at::cat({w_JD, mu_GD});
  }
  auto scores = at::matmul(x, w_JD.t());
  auto logits_TJ = scores.narrow(1, 0, J);
  auto priority_TG = options_.prefix_blocks ? at::Tensor() : scores.narrow(1, J, B).detach();
  auto r = unif_route(logits_TJ, priority_TG, options_);
  ExpertBlocks units(*slot.experts, B);
  auto y_TD = units.add_output_bias(dispatch(x_TD, r.assignment, units).y_TD, r.weight_TJ);
  routed.assignment = r.assignment;
  routed.scores_TE = r.probs_TQ;
  if (div_loss_coef_ > 0) routed.losses.emplace_back("div", div_loss_coef_ * unif_diversity_loss(slot.gate->weight));
  routed.counts = {{"shared_blocks", r.b_T, B}, {"residual_experts", r.k_T, K}, {"active_blocks", r.blocks_T, K * B}};
  return y_TD;
}

namespace {

void validate_unif(const Config& c) {
  const auto& m = c.model;
  const auto& u = m.moe.section<UniFConfig>();
  if (u.blocks == 0) return;
  if (m.ffn != "moe") throw ConfigError("model.moe.unif.blocks needs model.ffn = \"moe\"");
  if (u.blocks < 2 || m.moe.expert_hidden % u.blocks != 0)
    throw ConfigError(fmt::format("model.moe.unif.blocks ({}) must be >= 2 and divide model.moe.expert_hidden ({})",
                                  u.blocks, m.moe.expert_hidden));
  if (u.residual_top_k > m.moe.num_experts)
    throw ConfigError(
        fmt::format("model.moe.unif.residual_top_k ({}) exceeds the residual experts "
                    "(model.moe.num_experts = {})",
                    u.residual_top_k, m.moe.num_experts));
  const auto& e = m.moe;
  const std::vector<std::pair<bool, const char*>> refused = {
      {e.n_shared > 0, "model.moe.n_shared (UniF-MoE has its own shared expert)"},
      {e.capacity_factor > 0, "model.moe.capacity_factor"},
      {e.bias_update > 0, "model.moe.bias_update"},
      {e.seq_aux_loss_coef > 0, "model.moe.seq_aux_loss_coef"}};
  for (auto& [set, key] : refused)
    if (set) throw ConfigError(fmt::format("model.moe.unif.blocks cannot be combined with {}", key));
}

}  // namespace

nlohmann::json unif_accounting(const Config& c, const std::vector<std::shared_ptr<FeedForward>>& ffns) {
  const int64_t B = c.model.moe.section<UniFConfig>().blocks;
  const auto& bank = *moe_layers(ffns).front()->experts;
  const int64_t K = bank.num_units() - 1;
  const auto unit = unif_unit_cost(bank, B);
  auto cost = [&](int64_t active_blocks) {
    return nlohmann::json{{"blocks", active_blocks},
                          {"expert_parameters", active_blocks * unit.params},
                          {"expert_flops", active_blocks * unit.flops}};
  };
  return {{"blocks_per_expert", B},
          {"residual_experts", K},
          {"parameters_per_block", unit.params},
          {"flops_per_block", unit.flops},
          {"per_token_least", cost(B)},
          {"per_token_most", cost(1 + K * (B - 1))},
          {"top2_equivalent", cost(2 * B)},
          {"measured",
           "moeforge usage CHECKPOINT prints the mean shared_blocks, residual_experts and "
           "active_blocks per layer"}};
}

void register_unif() {
  auto ref = [](auto field) {
    return [field](Config & c) -> auto& { return c.model.moe.section<UniFConfig>().*field; };
  };
  register_config_keys({
      key_at<int64_t>("model.moe.unif.blocks", ref(&UniFConfig::blocks),
                      "UniF-MoE: split every expert into B aligned blocks and route shared-first over (expert, block) "
                      "units; the MoE blocks get a shared expert + model.moe.num_experts residual experts (0 = off)",
                      0, 4096),
      key_at<double>("model.moe.unif.div_loss_coef", ref(&UniFConfig::div_loss_coef),
                     "UniF-MoE diversity loss lambda_div on ||W*^T W* - I||_F (mean over MoE layers)", 0, 100),
      key_at<double>("model.moe.unif.fixed_alpha", ref(&UniFConfig::fixed_alpha),
                     "ablation: a constant shared weight alpha (the paper uses 0.4); 0 = adaptive alpha(x)", 0, 0.999),
      key_at<int64_t>(
          "model.moe.unif.residual_top_k", ref(&UniFConfig::residual_top_k),
          "ablation: always the top-n residual experts (the paper uses 2); 0 = cumulative mass >= 1 - alpha", 0, 4096),
      key_at<std::string>("model.moe.unif.block_select", ref(&UniFConfig::block_select),
                          "which blocks are shared: prototype (largest x . mu_b) or prefix (the first b; ablation)", 1,
                          0, {"prototype", "prefix"}),
  });
  register_config_validator(validate_unif);
  register_moe_extension("unif", [](const ModelConfig& c) -> std::shared_ptr<MoEExtension> {
    if (c.moe.section<UniFConfig>().blocks == 0) return nullptr;
    return std::make_shared<UniFExtension>(c);
  });
  MethodInfo info{"unif", "UniF-MoE", "UniF-MoE activated blocks",
                  "C_B = b + k (B - b) expert blocks per token (top-k activates k B); b: shared blocks, k: residual "
                  "experts."};
  info.units = "activated blocks C_B per token";
  info.facts = {"model.moe.unif.blocks"};
  info.enabled = [](const Config& c) { return c.model.moe.section<UniFConfig>().blocks > 0; };
  info.accounting = unif_accounting;
  register_upcycle_method("unif", [](const UpcycleOptions& o) {
    return std::vector<std::string>{fmt::format("model.moe.unif.blocks={}", o.blocks), "model.moe.aux_loss_coef=0",
                                    "model.moe.z_loss_coef=0", "model.moe.top_k=1"};
  });
  register_method_info(std::move(info));
}

}  // namespace mf
