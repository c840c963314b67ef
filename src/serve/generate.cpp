#include "serve/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include "data/tokenizer.h"

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

namespace {

// The next token of one row from its last logits [V]. Below kGreedyBelow the temperature's limit
// T -> 0, greedy, is taken: logits / T would overflow (5e-324 makes every logit infinite).
int64_t pick(const at::Tensor& logits_V, const SamplingOptions& opt, at::Generator& gen) {
  if (opt.temperature < kGreedyBelow) return logits_V.argmax().item<int64_t>();
  auto probs = top_p_filter(torch::softmax(logits_V / opt.temperature, -1), opt.top_p);
  return torch::multinomial(probs, 1, false, gen).item<int64_t>();
}

}  // namespace

void decode_rows(TransformerLM& model, std::vector<DecodeRow>& rows) {
  torch::NoGradGuard no_grad;
  model->eval();
  if (rows.empty()) return;
  const int64_t max_len = model->config().max_seq_len;
  std::vector<at::Generator> gens;
  std::vector<int64_t> flat, produced(rows.size(), 0);
  size_t length = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& o = rows[r].opt;
    gens.push_back(at::make_generator<at::CPUGeneratorImpl>(o.seed));
    std::vector<int64_t> ctx(rows[r].prompt.begin(), rows[r].prompt.end());
    if (ctx.empty()) ctx.push_back(o.stop_token >= 0 ? o.stop_token : 0);
    if (static_cast<int64_t>(ctx.size()) >= max_len) ctx.erase(ctx.begin(), ctx.end() - (max_len - 1));
    if (r == 0) length = ctx.size();
    if (ctx.size() != length)
      throw std::invalid_argument("decode_rows: the prompts must have one length (after truncation)");
    flat.insert(flat.end(), ctx.begin(), ctx.end());
  }
  std::vector<size_t> live;  // rows still decoding, in cache-row order
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r].opt.max_tokens > 0) live.push_back(r);
  if (live.empty()) return;
  std::vector<LayerCache> caches;
  AuxLosses aux;
  const auto rows_n = static_cast<int64_t>(rows.size());
  auto logits = model->forward(torch::tensor(flat, torch::kLong).view({rows_n, -1}), aux, &caches);
  if (live.size() < rows.size()) {  // rows asking for no tokens leave before the first step
    std::vector<int64_t> keep(live.begin(), live.end());
    auto index = torch::tensor(keep, torch::kLong);
    logits = logits.index_select(0, index);
    for (auto& c : caches) c = {c.k.index_select(0, index), c.v.index_select(0, index)};
  }
  while (!live.empty() && caches[0].length() < max_len) {
    auto last = logits.select(1, -1).to(torch::kFloat32);  // [live, V]
    std::vector<int64_t> keep, next;
    for (size_t i = 0; i < live.size(); ++i) {
      auto& row = rows[live[i]];
      const auto id = pick(last[static_cast<int64_t>(i)], row.opt, gens[live[i]]);
      if (id == row.opt.stop_token) continue;
      const bool more = row.on_token(static_cast<int>(id));
      if (more && ++produced[live[i]] < row.opt.max_tokens) {
        keep.push_back(static_cast<int64_t>(i));
        next.push_back(id);
      }
    }
    if (keep.empty()) break;
    if (keep.size() < live.size()) {
      auto index = torch::tensor(keep, torch::kLong);
      for (auto& c : caches) c = {c.k.index_select(0, index), c.v.index_select(0, index)};
      std::vector<size_t> still;
      for (auto i : keep) still.push_back(live[static_cast<size_t>(i)]);
      live = still;
    }
    logits =
        model->forward(torch::tensor(next, torch::kLong).view({static_cast<int64_t>(live.size()), 1}), aux, &caches);
  }
}

std::vector<std::vector<int>> generate_batch(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                                             const SamplingOptions& opt) {
  std::vector<std::vector<int>> out(prompts.size());
  std::vector<DecodeRow> rows;
  for (size_t r = 0; r < prompts.size(); ++r) {
    SamplingOptions o = opt;
    o.seed = opt.seed + r;
    rows.push_back({prompts[r], o, [&out, r](int id) {
                      out[r].push_back(id);
                      return true;
                    }});
  }
  decode_rows(model, rows);
  return out;
}

std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt) {
  return generate_batch(model, {prompt}, opt)[0];
}

std::function<std::string(TransformerLM&, const std::string&)> prompt_sampler(const SampleConfig& s) {
  return [s](TransformerLM& model, const std::string& tokenizer_path) {
    Tokenizer tok(tokenizer_path);
    SamplingOptions o{s.max_tokens, s.temperature, s.top_p, static_cast<uint64_t>(s.seed), tok.eos_id()};
    return s.prompt + tok.decode(generate(model, tok.encode(s.prompt), o));
  };
}

}  // namespace mf
