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

std::vector<std::vector<int>> generate_batch(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                                             const SamplingOptions& opt) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto rows = static_cast<int64_t>(prompts.size());
  std::vector<at::Generator> gens;
  std::vector<std::vector<int64_t>> ctx;
  const int64_t max_len = model->config().max_seq_len;
  for (int64_t r = 0; r < rows; ++r) {
    gens.push_back(at::make_generator<at::CPUGeneratorImpl>(opt.seed + static_cast<uint64_t>(r)));
    ctx.emplace_back(prompts[r].begin(), prompts[r].end());
    if (ctx[r].empty()) ctx[r].push_back(opt.stop_token >= 0 ? opt.stop_token : 0);
    if (static_cast<int64_t>(ctx[r].size()) >= max_len) ctx[r].erase(ctx[r].begin(), ctx[r].end() - (max_len - 1));
    if (ctx[r].size() != ctx[0].size())
      throw std::invalid_argument("generate_batch: the prompts must have one length (after truncation)");
  }
  std::vector<LayerCache> caches;
  AuxLosses aux;
  std::vector<int64_t> flat;
  for (auto& c : ctx) flat.insert(flat.end(), c.begin(), c.end());
  auto logits = model->forward(torch::tensor(flat, torch::kLong).view({rows, -1}), aux, &caches);
  std::vector<std::vector<int>> out(static_cast<size_t>(rows));
  std::vector<bool> done(static_cast<size_t>(rows), false);
  for (int64_t i = 0; i < opt.max_tokens && caches[0].length() < max_len; ++i) {
    auto last = logits.select(1, -1).to(torch::kFloat32);  // [rows, V]
    at::Tensor next_R;
    if (opt.temperature <= 0) {
      next_R = last.argmax(-1);
    } else {
      auto probs = top_p_filter(torch::softmax(last / opt.temperature, -1), opt.top_p);
      std::vector<at::Tensor> picks;
      for (int64_t r = 0; r < rows; ++r) picks.push_back(torch::multinomial(probs[r], 1, false, gens[r]));
      next_R = torch::cat(picks);
    }
    const auto next = next_R.contiguous();
    const auto* ids = next.data_ptr<int64_t>();
    bool all_done = true;
    for (int64_t r = 0; r < rows; ++r) {
      if (!done[r] && ids[r] == opt.stop_token) done[r] = true;
      if (!done[r]) out[r].push_back(static_cast<int>(ids[r]));
      all_done = all_done && done[r];
    }
    if (all_done) break;
    logits = model->forward(next.view({rows, 1}), aux, &caches);
  }
  return out;
}

std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt) {
  return generate_batch(model, {prompt}, opt)[0];
}

}  // namespace mf
