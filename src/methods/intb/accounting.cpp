#include <fmt/format.h>

#include "methods/intb/intb.h"

namespace mf {

IntBCost intb_cost(const IntBFeedForward& m) {
  const auto& o = m.options();
  const int64_t D = m.layer_width(0), E = o.blocks, A = o.basis, paths = o.gate_path ? 2 : 1;
  const int64_t dr = o.router_hidden, C = o.codebook_dim, R = o.hyper_hidden;
  IntBCost c;
  for (auto& p : m.parameters()) c.parameters += p.numel();
  int64_t block = 0, weights = 0;  // one composed block: value (and gate) weights and biases of every internal layer
  for (int64_t l = 0; l < o.internal_layers; ++l) {
    const int64_t O = m.layer_width(l + 1), I = m.layer_width(l);
    block += paths * (O * I + O);
    weights += paths * O * I;
    c.flops_compose += 2 * E * A * paths * (O * I + O);
  }
  const int64_t router = D * dr + dr + dr * E + E, filter_x = o.filter ? D * D : 0;
  const int64_t shared = m.shared_expert ? m.shared_expert->parameter_count() : 0;
  c.materialized_parameters = E * block + (o.filter ? E * D : 0);
  c.executed_parameters = router + filter_x + o.top_k * block + shared;
  c.flops_cached = 2 * (D * dr + dr * E) + 2 * filter_x + 2 * o.top_k * weights + 2 * shared;
  c.flops_compose += 2 * E * (C * R + R * 2 * A) + (o.filter ? 2 * E * C * D : 0);
  if (o.baked) c.flops_compose = 0;  // the blocks are stored composed
  return c;
}

nlohmann::json intb_accounting(const std::vector<std::shared_ptr<FeedForward>>& ffns, int64_t tokens) {
  std::vector<IntBFeedForward*> slots;
  for (auto& f : ffns)
    if (auto* s = dynamic_cast<IntBFeedForward*>(f.get())) slots.push_back(s);
  if (slots.empty()) return {};
  const auto& o = slots.front()->options();
  const auto c = intb_cost(*slots.front());
  return {{"slots", slots.size()},
          {"blocks", o.blocks},
          {"top_k", o.top_k},
          {"basis", o.basis},
          {"internal_layers", o.internal_layers},
          {"participation", fmt::format("all {} bases of every internal layer", o.basis)},
          {"execution", fmt::format("{} blocks per token", o.top_k)},
          {"materialization", fmt::format("{} blocks per slot", o.blocks)},
          {"parameters_per_slot", c.parameters},
          {"executed_parameters_per_token", c.executed_parameters},
          {"materialized_parameters_per_slot", c.materialized_parameters},
          {"flops_per_token_cached", c.flops_cached},
          {"flops_compose_per_forward", c.flops_compose},
          {"flops_per_token_uncached", c.flops_cached + c.flops_compose / std::max<int64_t>(1, tokens)},
          {"uncached_tokens_per_forward", tokens}};
}

}  // namespace mf
