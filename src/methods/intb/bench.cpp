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
  int64_t n = c.filter_ED.defined() ? static_cast<int64_t>(c.filter_ED.nbytes()) : 0;
  for (auto* v : {&c.value_EOI, &c.value_EO, &c.gate_EOI, &c.gate_EO})
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

ResultTable intb_inference_table(const std::vector<IntBBenchRow>& rows) {
  ResultTable t({{"basis", "E", "", 5},
                 {"cached_ms", "cached ms", "{:.3f}", 10},
                 {"uncached_ms", "uncached ms", "{:.3f}", 12},
                 {"vs_first", "vs E[0]", "{:.2f}x", 9},
                 {"cached_mib", "cached MiB", "{:.2f}", 11},
                 {"uncached_mib", "uncached MiB", "{:.2f}", 13},
                 {"gflop_per_token", "GFLOP/token", "{:.5f}", 12},
                 {"uncached_gflop_per_token", "uncached GFLOP", "{:.5f}", 15}});
  for (const auto& r : rows)
    t.add({{"basis", r.basis},
           {"cached_seconds", r.cached_seconds},
           {"uncached_seconds", r.uncached_seconds},
           {"cached_bytes", r.cached_bytes},
           {"uncached_bytes", r.uncached_bytes},
           {"flops_cached", r.flops_cached},
           {"flops_uncached", r.flops_uncached},
           {"cached_ms", 1e3 * r.cached_seconds},
           {"uncached_ms", 1e3 * r.uncached_seconds},
           {"vs_first", r.cached_seconds / rows.front().cached_seconds},
           {"cached_mib", static_cast<double>(r.cached_bytes) / 1048576.0},
           {"uncached_mib", static_cast<double>(r.uncached_bytes) / 1048576.0},
           {"gflop_per_token", static_cast<double>(r.flops_cached) * 1e-9},
           {"uncached_gflop_per_token", static_cast<double>(r.flops_uncached) * 1e-9}});
  return t;
}

ResultTable intb_training_table(const std::vector<IntBTrainRow>& rows, int64_t train_tokens) {
  ResultTable t({{"label", "slot", "", -36},
                 {"parameters", "parameters", "", 12},
                 {"ms", "ms", "{:.2f}", 10},
                 {"tokens_per_s", "tokens/s", "{:.0f}", 12},
                 {"vs_intb", "time / IntBMoE", "{:.2f}x", 15}});
  for (const auto& r : rows)
    t.add({{"arm", r.arm},
           {"label", r.label},
           {"parameters", r.parameters},
           {"seconds", r.seconds},
           {"ms", 1e3 * r.seconds},
           {"tokens_per_s", static_cast<double>(train_tokens) / r.seconds},
           {"vs_intb", r.seconds / rows.front().seconds}});
  return t;
}

}  // namespace mf
