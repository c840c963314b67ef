#include "serve/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <numeric>

#include "data/tokenizer.h"
#include "serve/decode_engine.h"
#include "serve/sampling.h"

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

// at::argmax's rule: the first of the largest, a NaN counting as larger than any number. Two
// LibTorch calls per decoded row were a third of the calls of a batch-8 step (bench generate).
int64_t first_max(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return i;
    if (v[i] > v[best]) best = i;
  }
  return best;
}

// Below kGreedyBelow the temperature's limit T -> 0, greedy, is taken: logits / T would overflow
// (5e-324 makes every logit infinite).
int64_t pick_token(const at::Tensor& logits_V, const SamplingOptions& opt, at::Generator& gen) {
  const bool floats = logits_V.scalar_type() == at::kFloat && logits_V.is_contiguous() && logits_V.is_cpu() &&
                      logits_V.dim() == 1;  // read in place, no LibTorch call
  if (opt.temperature < kGreedyBelow)
    return floats ? first_max(logits_V.data_ptr<float>(), logits_V.numel()) : logits_V.argmax().item<int64_t>();
  if (floats) return sample_token(logits_V.data_ptr<float>(), logits_V.numel(), opt.temperature, opt.top_p, gen);
  auto probs = top_p_filter(torch::softmax(logits_V / opt.temperature, -1), opt.top_p);
  return torch::multinomial(probs, 1, false, gen).item<int64_t>();
}

at::Tensor prompt_batch(const std::vector<DecodeRow>& rows, int64_t max_len) {
  std::vector<int64_t> flat;
  size_t length = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& o = rows[r].opt;
    std::vector<int64_t> ctx(rows[r].prompt.begin(), rows[r].prompt.end());
    if (ctx.empty()) ctx.push_back(o.stop_token >= 0 ? o.stop_token : 0);
    if (static_cast<int64_t>(ctx.size()) >= max_len) ctx.erase(ctx.begin(), ctx.end() - (max_len - 1));
    if (r == 0) length = ctx.size();
    if (ctx.size() != length)
      throw std::invalid_argument("decode_rows: the prompts must have one length (after truncation)");
    flat.insert(flat.end(), ctx.begin(), ctx.end());
  }
  return torch::tensor(flat, torch::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

namespace {

bool runs_engine(TransformerLMImpl& model, DecodePath path) {
  if (path == DecodePath::Modules) return false;
  const auto why = DecodeEngine::unsupported(model);
  if (path == DecodePath::Engine && !why.empty()) throw ConfigError("the decode engine does not run " + why);
  return why.empty();
}

// The next tokens' logits [rows, V] for the live rows, by the engine (slot i = the live row
// that was i-th after the prompt) or by the modules over their caches.
struct Steps {
  std::unique_ptr<DecodeEngine> engine;
  std::vector<LayerCache> caches;
  std::vector<int64_t> slots;  // the live rows' slots

  void keep(const std::vector<int64_t>& kept) {
    std::vector<int64_t> still;
    for (auto i : kept) still.push_back(slots[static_cast<size_t>(i)]);
    slots = still;
    if (engine) return;
    auto index = torch::tensor(kept, torch::kLong);
    for (auto& c : caches) c = {c.k.index_select(0, index), c.v.index_select(0, index)};
  }
  at::Tensor next(TransformerLM& model, const std::vector<int64_t>& tokens) {
    if (engine) return engine->step(slots, tokens);
    AuxLosses aux;
    const auto n = static_cast<int64_t>(tokens.size());
    return model->forward(torch::tensor(tokens, torch::kLong).view({n, 1}), aux, &caches).select(1, -1);
  }
};

}  // namespace

void decode_rows(TransformerLM& model, std::vector<DecodeRow>& rows, DecodePath path) {
  torch::NoGradGuard no_grad;
  model->eval();
  if (rows.empty()) return;
  const int64_t max_len = model->config().max_seq_len;
  std::vector<at::Generator> gens;
  for (auto& row : rows) gens.push_back(at::make_generator<at::CPUGeneratorImpl>(row.opt.seed));
  const auto prompts = prompt_batch(rows, max_len);
  std::vector<size_t> live;  // rows still decoding, in step order
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r].opt.max_tokens > 0) live.push_back(r);
  if (live.empty()) return;
  Steps steps;
  at::Tensor last;  // [live rows, V]
  std::vector<int64_t> kept(live.begin(), live.end());
  const bool engine = runs_engine(*model, path);
  if (engine) {
    steps.engine = std::make_unique<DecodeEngine>(*model, static_cast<int64_t>(live.size()));
    steps.slots.resize(live.size());
    std::iota(steps.slots.begin(), steps.slots.end(), 0);
  }
  if (engine) {  // prompts too, kPrefillRows tokens a step: faster than the modules' GEMMs (docs/benchmarks.md)
    std::vector<at::Tensor> firsts;
    for (size_t i = 0; i < live.size(); ++i) {
      const auto row = prompts[static_cast<int64_t>(live[i])].contiguous();
      firsts.push_back(
          steps.engine->prefill(static_cast<int64_t>(i),
                                std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel())));
    }
    last = at::stack(firsts);
  } else {
    AuxLosses aux;
    last = model->forward(prompts, aux, &steps.caches).select(1, -1);
    last = live.size() < rows.size() ? last.index_select(0, torch::tensor(kept, torch::kLong)) : last;
    steps.slots.resize(rows.size());  // the modules' cache rows; rows asking for no tokens leave now
    std::iota(steps.slots.begin(), steps.slots.end(), 0);
    if (live.size() < rows.size()) steps.keep(kept);
  }
  std::vector<int64_t> produced(rows.size(), 0);
  for (int64_t length = prompts.size(1); !live.empty() && length < max_len; ++length) {
    last = last.to(torch::kFloat32);
    std::vector<int64_t> kept, next;
    for (size_t i = 0; i < live.size(); ++i) {
      auto& row = rows[live[i]];
      const auto id = pick_token(last[static_cast<int64_t>(i)], row.opt, gens[live[i]]);
      if (id == row.opt.stop_token) continue;
      const bool more = row.on_token(static_cast<int>(id));
      if (more && ++produced[live[i]] < row.opt.max_tokens) {
        kept.push_back(static_cast<int64_t>(i));
        next.push_back(id);
      }
    }
    if (kept.empty()) break;
    if (kept.size() < live.size()) {
      steps.keep(kept);
      std::vector<size_t> still;
      for (auto i : kept) still.push_back(live[static_cast<size_t>(i)]);
      live = still;
    }
    last = steps.next(model, next);
  }
}

std::vector<std::vector<int>> generate_batch(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                                             const SamplingOptions& opt, DecodePath path) {
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
  decode_rows(model, rows, path);
  return out;
}

std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt,
                          DecodePath path) {
  return generate_batch(model, {prompt}, opt, path)[0];
}

std::function<std::string(TransformerLM&, const std::string&)> prompt_sampler(const SampleConfig& s) {
  return [s](TransformerLM& model, const std::string& tokenizer_path) {
    Tokenizer tok(tokenizer_path);
    SamplingOptions o{s.max_tokens, s.temperature, s.top_p, static_cast<uint64_t>(s.seed), tok.eos_id()};
    return s.prompt + tok.decode(generate(model, tok.encode(s.prompt), o));
  };
}

}  // namespace mf
