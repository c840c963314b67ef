#include "serve/generate.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mf {

at::Tensor top_p_filter(const at::Tensor& probs, double top_p) {
  if (top_p >= 1.0) return probs;
  auto sorted = probs.sort(-1, /*descending=*/true);
  auto p = std::get<0>(sorted), idx = std::get<1>(sorted);
  auto before = p.cumsum(-1) - p;  // mass of strictly more probable tokens
  auto keep = before < top_p;      // always keeps the first
  auto filtered = torch::zeros_like(probs).scatter(-1, idx, p * keep.to(p.dtype()));
  return filtered / filtered.sum(-1, true);
}

std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  std::vector<LayerCache> caches;
  AuxLosses aux;
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  if (ctx.empty()) ctx.push_back(opt.stop_token >= 0 ? opt.stop_token : 0);
  const int64_t max_len = model->config().max_seq_len;
  if (static_cast<int64_t>(ctx.size()) >= max_len) ctx.erase(ctx.begin(), ctx.end() - (max_len - 1));
  auto logits = model->forward(torch::tensor(ctx, torch::kLong).unsqueeze(0), aux, &caches);
  std::vector<int> out;
  for (int64_t i = 0; i < opt.max_tokens && caches[0].length() < max_len; ++i) {
    auto last = logits.select(1, -1).squeeze(0).to(torch::kFloat32);
    int64_t next;
    if (opt.temperature <= 0) {
      next = last.argmax().item<int64_t>();
    } else {
      auto probs = top_p_filter(torch::softmax(last / opt.temperature, -1), opt.top_p);
      next = torch::multinomial(probs, 1, false, gen).item<int64_t>();
    }
    if (next == opt.stop_token) break;
    out.push_back(static_cast<int>(next));
    logits = model->forward(torch::tensor({next}, torch::kLong).unsqueeze(0), aux, &caches);
  }
  return out;
}

}  // namespace mf
