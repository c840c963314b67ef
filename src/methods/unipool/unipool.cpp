#include "methods/unipool/unipool.h"

#include <fmt/format.h>

#include "core/config_keys.h"
#include "model/method_info.h"

namespace mf {

void UniPoolExtension::plan(std::map<int64_t, MoELayerShape>& shapes) {
  const auto& u = config_.moe.section<UniPoolConfig>();
  std::vector<int64_t> moe;
  for (auto& [layer, s] : shapes) moe.push_back(layer);
  const auto per_group = static_cast<int64_t>(moe.size()) / u.groups;
  for (int64_t g = 0; g < u.groups; ++g) {
    ExpertPool p;
    p.layers.assign(moe.begin() + g * per_group, moe.begin() + (g + 1) * per_group);
    const auto& first = shapes.at(p.layers.front());
    for (auto layer : p.layers) {
      const auto& s = shapes.at(layer);
      if (s.latent != first.latent || s.expert_hidden != first.expert_hidden)
        throw ConfigError(fmt::format(
            "model.moe.latent.shapes gives MoE block {} latent width {} and expert width {}, but block {} of the same "
            "pool (model.moe.unipool.groups = {}) has {} and {}: the layers of one pool share one latent shape",
            layer, s.latent, s.expert_hidden, p.layers.front(), u.groups, first.latent, first.expert_hidden));
      p.size += s.vanilla_experts;  // the vanilla budget of the group
    }
    if (u.pool_size > 0) p.size = u.pool_size / u.groups;
    for (auto layer : p.layers) shapes.at(layer).num_experts = p.size;
    pools_.push_back(std::move(p));
  }
}

void UniPoolExtension::attach(MoEFeedForward& slot) {
  for (size_t g = 0; g < pools_.size(); ++g) {
    auto& p = pools_[g];
    if (std::find(p.layers.begin(), p.layers.end(), slot.layer) == p.layers.end()) continue;
    slot.bank_group = static_cast<int64_t>(g);
    if (slot.layer == p.layers.front()) {  // slots are built in block order: the first one makes the pool
      const auto& m = config_.moe;
      const auto& s = slot.shape();
      p.bank = std::make_shared<ExpertBank>(p.size, slot.width(), s.expert_hidden, m.activation, m.expert_bias);
      slot.experts = slot.register_module("experts", p.bank);
      const double alpha = m.section<UniPoolConfig>().aux_loss_coef;
      if (alpha > 0) {
        p.balance = PoolBalance(p.size, static_cast<int64_t>(p.layers.size()), alpha);
        slot.register_module("pool_balance", p.balance);
      }
    }
    slot.experts = p.bank;
  }
}

void UniPoolExtension::routed(MoEFeedForward& slot, RouterOutput& routed, bool record) {
  if (slot.bank_group < 0) return;
  auto& balance = pools_[static_cast<size_t>(slot.bank_group)].balance;
  if (balance)
    routed.losses.emplace_back("pool_aux", balance->layer_loss(routed.scores_TE, routed.assignment.unit_P, record));
}

namespace {

void validate_unipool(const Config& c) {
  const auto& m = c.model;
  const auto& u = m.moe.section<UniPoolConfig>();
  if (u.groups == 0) {
    if (u.aux_loss_coef > 0)
      throw ConfigError("model.moe.unipool.aux_loss_coef needs a shared pool (model.moe.unipool.groups >= 1)");
    return;
  }
  if (m.ffn != "moe") throw ConfigError("model.moe.unipool.groups needs model.ffn = \"moe\"");
  const int64_t n_moe = num_moe_layers(m);
  if (n_moe % u.groups != 0)
    throw ConfigError(
        fmt::format("model.moe.unipool.groups ({}) must divide the number of MoE layers ({}, "
                    "model.moe.layers)",
                    u.groups, n_moe));
  if (u.pool_size % u.groups != 0)
    throw ConfigError(fmt::format("model.moe.unipool.pool_size ({}) must be divisible by model.moe.unipool.groups ({})",
                                  u.pool_size, u.groups));
  const auto& e = m.moe;
  const std::vector<std::pair<bool, const char*>> refused = {{e.n_shared > 0, "model.moe.n_shared"},
                                                             {e.capacity_factor > 0, "model.moe.capacity_factor"},
                                                             {e.bias_update > 0, "model.moe.bias_update"}};
  for (auto& [set, key] : refused)
    if (set)
      throw ConfigError(
          fmt::format("model.moe.unipool.groups cannot be combined with {}: shared pools have no "
                      "shared experts, capacity limits or selection bias",
                      key));
}

}  // namespace

void register_unipool() {
  auto ref = [](auto field) {
    return [field](Config & c) -> auto& { return c.model.moe.section<UniPoolConfig>().*field; };
  };
  register_config_keys({
      key_at<int64_t>("model.moe.unipool.groups", ref(&UniPoolConfig::groups),
                      "UniPool sharing scope G: MoE layers form G contiguous groups, each routing into one shared "
                      "expert pool (0 = per-layer experts; G = number of MoE layers is vanilla MoE)",
                      0, 4096),
      key_at<int64_t>("model.moe.unipool.pool_size", ref(&UniPoolConfig::pool_size),
                      "total pool experts M over all groups (0 = the vanilla budget: each layer's experts summed)", 0,
                      1 << 20),
      key_at<double>("model.moe.unipool.aux_loss_coef", ref(&UniPoolConfig::aux_loss_coef),
                     "pool-level balance loss alpha_pool (one step behind; 1e-2 in the paper; 0 = off)", 0, 100),
  });
  register_config_alias("model.moe.pool_groups", "model.moe.unipool.groups");
  register_config_alias("model.moe.pool_size", "model.moe.unipool.pool_size");
  register_config_alias("model.moe.pool_aux_loss_coef", "model.moe.unipool.aux_loss_coef");
  register_config_validator(validate_unipool);
  register_moe_extension("unipool", [](const ModelConfig& c) -> std::shared_ptr<MoEExtension> {
    if (c.moe.section<UniPoolConfig>().groups == 0) return nullptr;
    return std::make_shared<UniPoolExtension>(c);
  });
  MethodInfo info{"unipool", "UniPool", "UniPool pool routing",
                  "Every MoE block of a group routes into one shared pool of experts."};
  info.pooled = true;
  info.facts = {"model.moe.unipool.groups", "model.moe.unipool.pool_size"};
  info.enabled = [](const Config& c) { return c.model.moe.section<UniPoolConfig>().groups > 0; };
  register_method_info(std::move(info));
}

}  // namespace mf
