#include "methods/unif/bench.h"

#include <torch/torch.h>

#include "core/timing.h"
#include "methods/unif/unif.h"
#include "model/params.h"

namespace mf {
namespace {

ModelConfig layer_config(const UniFBenchOptions& o, int64_t top_k, bool unif) {
  ModelConfig c;
  c.d_model = o.d_model;
  c.n_layers = 1;
  c.ffn = "moe";
  c.moe.num_experts = o.experts;
  c.moe.top_k = top_k;
  c.moe.expert_hidden = o.hidden;
  c.moe.activation = Activation::GELU;
  c.moe.expert_bias = true;
  c.moe.aux_loss_coef = 0;
  c.moe.z_loss_coef = 0;
  if (unif) c.moe.section<UniFConfig>().blocks = o.blocks;
  return c;
}

}  // namespace

std::vector<UniFBenchRow> bench_unif(const UniFBenchOptions& opt) {
  std::vector<UniFBenchRow> rows;
  const std::vector<std::pair<std::string, int64_t>> layers = {{"unif", 0}, {"top-2", 2}, {"top-1", 1}};
  for (double scale : opt.input_scales) {
    torch::manual_seed(0);
    auto x = torch::randn({opt.tokens, opt.d_model}) * scale;
    auto grad = torch::ones_like(x);
    for (auto& [name, k] : layers) {
      const auto c = layer_config(opt, name == "unif" ? 1 : k, name == "unif");
      auto slot = std::make_shared<MoEFeedForward>(c, 0, plan_moe(c));
      init_by_role(*slot, 1, c);
      UniFBenchRow r{name, scale};
      AuxLosses aux;
      slot->eval();
      r.infer_seconds = best_seconds(opt.iters, [&] {
        torch::NoGradGuard g;
        slot->forward(x, aux);
      });
      r.mean_blocks =
          slot->last_stats().mean_units_per_token * (name == "unif" ? 1.0 : static_cast<double>(opt.blocks));
      slot->train();
      auto xg = x.clone().requires_grad_(true);
      r.train_seconds = best_seconds(opt.iters, [&] {
        AuxLosses a;
        slot->forward(xg, a).backward(grad);
      });
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace mf
