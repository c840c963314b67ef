#include "methods/intb/bench.h"

#include <torch/torch.h>

#include "core/timing.h"
#include "methods/intb/intb.h"
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

}  // namespace mf
