#include "methods/intb/bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/timing.h"
#include "io/layer_run.h"
#include "methods/intb/intb.h"
#include "methods/intb/repro.h"
#include "model/params.h"

namespace mf {
namespace {

int64_t bytes_of(const ComposedBlocks& c) {
  int64_t n = c.filter_KD.defined() ? static_cast<int64_t>(c.filter_KD.nbytes()) : 0;
  for (auto* v : {&c.value_KOI, &c.value_KO, &c.gate_KOI, &c.gate_KO})
    for (auto& t : *v) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace

std::vector<IntBBenchRow> bench_intb(const IntBBenchOptions& o) {
  std::vector<IntBBenchRow> rows;
  torch::manual_seed(0);
  const auto x = torch::randn({o.tokens, o.d_model});
  for (auto E : o.basis) {
    IntBOptions io;
    io.blocks = o.blocks;
    io.basis = E;
    io.top_k = o.top_k;
    io.hidden = o.hidden;
    io.shared_hidden = o.shared_hidden;
    auto slot = std::make_shared<IntBFeedForward>(o.d_model, io);
    init_by_role(*slot, 1, ModelConfig{});
    slot->eval();
    torch::NoGradGuard g;
    AuxLosses aux;
    IntBBenchRow r;
    r.basis = E;
    r.cached_seconds = best_seconds(o.iters, [&] { slot->forward(x, aux); });  // the warm-up call composes
    r.uncached_seconds = best_seconds(o.iters, [&] {
      slot->clear_cache();
      slot->forward(x, aux);
    });
    int64_t pool = 0, params = 0;
    for (auto& p : slot->named_parameters()) {
      params += static_cast<int64_t>(p.value().nbytes());
      const auto& k = p.key();
      if (k.rfind("basis", 0) == 0 || k == "codebook" || k.rfind("hyper", 0) == 0 ||
          k.find("_head.") != std::string::npos)
        pool += static_cast<int64_t>(p.value().nbytes());
    }
    const auto blocks = bytes_of(slot->cached_blocks());
    r.cached_bytes = params - pool + blocks;
    r.uncached_bytes = params + blocks;
    const auto c = intb_cost(*slot);
    r.flops_cached = c.flops_cached;
    r.flops_uncached = c.flops_cached + c.flops_compose / o.tokens;
    rows.push_back(r);
  }
  return rows;
}

std::vector<IntBTrainRow> bench_intb_training(const IntBBenchOptions& o) {
  Config base;
  for (const auto& set :
       {fmt::format("model.d_model={}", o.d_model), std::string("model.n_layers=1"), std::string("model.n_heads=4"),
        std::string("model.n_kv_heads=4"), std::string("model.ffn=intb"), std::string("model.moe.layers=all"),
        fmt::format("model.moe.num_experts={}", o.blocks), fmt::format("model.moe.top_k={}", o.top_k),
        fmt::format("model.moe.expert_hidden={}", o.hidden), fmt::format("model.moe.intb.basis={}", o.train_basis),
        fmt::format("model.moe.intb.shared_hidden={}", o.shared_hidden)})
    apply_override(base, set);
  validate(base);
  auto slot_parameters = [](const Config& c) {
    int64_t n = 0;
    for (auto& p : build_layer_slot(c, 0).slot->parameters()) n += p.numel();
    return n;
  };
  const int64_t target = slot_parameters(base);
  torch::manual_seed(0);
  const auto x = torch::randn({o.train_tokens, o.d_model}).requires_grad_();
  const auto dy = torch::randn({o.train_tokens, o.d_model});
  std::vector<IntBTrainRow> rows;
  for (auto arm : intb_arms(base, false)) {
    if (arm.group == "paper" && arm.name != "intb") continue;  // the slots at IntBMoE's parameters
    arm.hi = std::min<int64_t>(arm.hi, 16 * o.hidden);         // keeps the search's largest slot small
    const auto cfg = arm_config(base, arm, target, slot_parameters);
    auto s = build_layer_slot(cfg, 0);
    s.slot->train();
    IntBTrainRow r{arm.name, arm.label, slot_parameters(cfg)};
    r.seconds = best_seconds(o.iters, [&] {
      AuxLosses aux;
      auto y = s.slot->forward(x, aux);
      auto loss = (y * dy).sum();
      if (auto a = aux.total(); a.defined()) loss = loss + a;
      loss.backward();
      for (auto& p : s.slot->parameters()) p.mutable_grad() = at::Tensor();
      x.mutable_grad() = at::Tensor();
    });
    rows.push_back(r);
  }
  return rows;
}

}  // namespace mf
