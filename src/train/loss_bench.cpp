#include "train/loss_bench.h"

#include <torch/torch.h>

#include <chrono>
#include <functional>

#include "core/runtime.h"
#include "model/fused_loss.h"
#include "model/transformer.h"

namespace mf {

std::vector<LossBenchRow> bench_lm_loss(int64_t tokens, int64_t d_model, int64_t vocab, int iters, int64_t chunk) {
  torch::manual_seed(0);
  auto h = torch::randn({tokens, d_model}).requires_grad_();
  auto w = (0.02 * torch::randn({vocab, d_model})).requires_grad_();
  const auto t = torch::randint(0, vocab, {tokens}, torch::kLong);
  const auto run = [&](const std::string& name, const std::function<torch::Tensor()>& loss) {
    LossBenchRow r{name, 1e30, 0, 0};
    reset_peak_rss();  // the fused path runs first, so the heap holds nothing the plain one left
    const int64_t base = peak_rss_bytes();
    for (int i = 0; i < iters; ++i) {
      h.mutable_grad() = torch::Tensor();
      w.mutable_grad() = torch::Tensor();
      const auto t0 = std::chrono::steady_clock::now();
      auto l = loss();
      l.backward();
      r.seconds = std::min(r.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      r.loss = l.item<double>();
    }
    r.peak_bytes = peak_rss_bytes() - base;
    return r;
  };
  std::vector<LossBenchRow> rows;
  rows.push_back(run("fused, chunked (ours)", [&] { return fused_lm_loss(h, w, t, chunk); }));
  rows.push_back(
      run("logits, then cross entropy", [&] { return lm_loss(torch::matmul(h, w.t()).unsqueeze(0), t.unsqueeze(0)); }));
  return rows;
}

ResultTable loss_table(const std::vector<LossBenchRow>& rows) {
  ResultTable t({{"loss", "loss", "", -28},
                 {"ms", "ms", "{:.1f}", 10},
                 {"peak_mb", "peak MB (extra)", "{:.1f}", 16},
                 {"value", "loss value", "{:.6f}", 12}});
  for (const auto& r : rows)
    t.add({{"loss", r.name},
           {"ms", 1e3 * r.seconds},
           {"peak_mb", static_cast<double>(r.peak_bytes) / 1e6},
           {"value", r.loss}});
  return t;
}

}  // namespace mf
