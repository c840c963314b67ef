#include "methods/unif/bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/timing.h"
#include "methods/unif/slots.h"
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

// The layers are timed in turns, one call each per round, best over the rounds: a slow phase of
// a shared machine then hits every layer alike instead of whichever layer ran during it.
std::vector<UniFBenchRow> bench_unif(const UniFBenchOptions& opt) {
  std::vector<UniFBenchRow> rows;
  const std::vector<std::pair<std::string, int64_t>> layers = {{"unif", 0}, {"top-2", 2}, {"top-1", 1}};
  for (double scale : opt.input_scales) {
    torch::manual_seed(0);
    auto x = torch::randn({opt.tokens, opt.d_model}) * scale;
    auto xg = x.clone().requires_grad_(true);
    auto grad = torch::ones_like(x);
    std::vector<std::shared_ptr<MoEFeedForward>> slots;
    for (auto& [name, k] : layers) {
      const auto c = layer_config(opt, name == "unif" ? 1 : k, name == "unif");
      slots.push_back(std::make_shared<MoEFeedForward>(c, 0, plan_moe(c)));
      init_by_role(*slots.back(), 1, c);
    }
    auto infer = [&](MoEFeedForward& slot) {
      torch::NoGradGuard g;
      AuxLosses aux;
      slot.eval();
      slot.forward(x, aux);
    };
    auto train = [&](MoEFeedForward& slot) {
      AuxLosses aux;
      slot.train();
      slot.forward(xg, aux).backward(grad);
    };
    std::vector<UniFBenchRow> scale_rows;
    for (size_t i = 0; i < layers.size(); ++i) {
      UniFBenchRow r;
      r.layer = layers[i].first;
      r.input_scale = scale;
      infer(*slots[i]);  // warm-up, and the routing statistics
      r.mean_blocks =
          slots[i]->last_stats().mean_units_per_token * (r.layer == "unif" ? 1.0 : static_cast<double>(opt.blocks));
      scale_rows.push_back(r);
    }
    // each layer's inference and training passes in rounds (core/timing.h), two untimed first: the
    // first rounds in turns still ran slow (heap growth)
    std::vector<std::function<void()>> passes;
    for (auto& slot : slots) {
      passes.push_back([&infer, &slot] { infer(*slot); });
      passes.push_back([&train, &slot] { train(*slot); });
    }
    const auto rounds = round_seconds(opt.iters, passes);
    for (size_t i = 0; i < slots.size(); ++i) {
      auto& r = scale_rows[i];
      r.infer_rounds = rounds[2 * i];
      r.train_rounds = rounds[2 * i + 1];
      r.infer_seconds = *std::min_element(r.infer_rounds.begin(), r.infer_rounds.end());
      r.train_seconds = *std::min_element(r.train_rounds.begin(), r.train_rounds.end());
    }
    rows.insert(rows.end(), scale_rows.begin(), scale_rows.end());
  }
  return rows;
}

namespace {

std::string block_verdict(double scale, const char* what, double time, double blocks, double within) {
  const double off = time / blocks - 1;
  return fmt::format(
      "scale {:.1f}, {}: UniF-MoE's time ratio to top-2 is {:.0f} % {} its block ratio C_B / (2B) "
      "(target: within {:.0f} %; {})\n",
      scale, what, 100 * std::abs(off), off >= 0 ? "above" : "below", 100 * within,
      std::abs(off) <= within ? "met" : "not met");
}

}  // namespace

UniFBenchReport unif_bench_report(const std::vector<UniFBenchRow>& rows, const UniFBenchOptions& opt, int threads) {
  UniFBenchReport out{
      fmt::format("{:>6} {:<6} {:>11} {:>11} {:>11} {:>10} {:>10} {:>10} {:>13}\n", "scale", "layer", "mean C_B",
                  "infer ms", "train ms", "best/best", "vs top-2", "train vs", "C_B / top-2"),
      nlohmann::json::array()};
  std::string verdicts;
  for (const auto& r : rows) {
    const auto& top2 = *std::find_if(rows.begin(), rows.end(),
                                     [&](auto& o) { return o.layer == "top-2" && o.input_scale == r.input_scale; });
    const double best = r.infer_seconds / top2.infer_seconds, infer = median_ratio(r.infer_rounds, top2.infer_rounds),
                 train = median_ratio(r.train_rounds, top2.train_rounds), blocks = r.mean_blocks / top2.mean_blocks;
    out.text += fmt::format("{:>6.1f} {:<6} {:>11.2f} {:>11.1f} {:>11.1f} {:>9.2f}x {:>9.2f}x {:>9.2f}x {:>12.2f}x\n",
                            r.input_scale, r.layer, r.mean_blocks, 1e3 * r.infer_seconds, 1e3 * r.train_seconds, best,
                            infer, train, blocks);
    out.json.push_back({{"layer", r.layer},
                        {"input_scale", r.input_scale},
                        {"mean_blocks", r.mean_blocks},
                        {"infer_seconds", r.infer_seconds},
                        {"train_seconds", r.train_seconds},
                        {"infer_rounds_seconds", r.infer_rounds},
                        {"train_rounds_seconds", r.train_rounds},
                        {"infer_best_vs_top2", best},
                        {"infer_vs_top2", infer},
                        {"train_vs_top2", train},
                        {"blocks_vs_top2", blocks}});
    if (r.layer == "unif")
      verdicts += block_verdict(r.input_scale, "inference", infer, blocks, 0.15) +
                  block_verdict(r.input_scale, "training", train, blocks, 0.20);
  }
  out.text +=
      verdicts + fmt::format(
                     "T = {}, d = {}, H = {}, K = {}, B = {}, {} threads; {} rounds, layers in turns: times are "
                     "the best round, \"vs top-2\" (inference) and \"train vs\" the median over rounds of the "
                     "time over top-2's in the same round\n",
                     opt.tokens, opt.d_model, opt.hidden, opt.experts, opt.blocks, threads, opt.iters);
  return out;
}

}  // namespace mf
