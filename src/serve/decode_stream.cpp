#include "serve/decode_stream.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace mf {
namespace {
TransformerLM checked(TransformerLM model) {
  if (const auto why = DecodeEngine::unsupported(*model); !why.empty())
    throw ConfigError("continuous batching runs in the decode engine, which does not run " + why);
  return model;
}
}  // namespace

DecodeStream::DecodeStream(TransformerLM model, int64_t slots)
    : model_(checked(std::move(model))), engine_(*model_, slots) {
  for (int64_t s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

int64_t DecodeStream::add(DecodeRow row) {
  TORCH_CHECK(has_room(), "decode stream: all ", engine_.slots(), " slots are taken");
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto seed = row.opt.seed;
  Live live{next_id_++, free_slots_.back(), 0, std::move(row), at::make_generator<at::CPUGeneratorImpl>(seed), {}, {}};
  if (live.row.opt.max_tokens > 0) {  // a row asking for nothing ends at the next step, unread
    const auto prompt = prompt_batch({live.row}, model_->config().max_seq_len);  // fed from the next step on
    live.prompt.assign(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
  }
  free_slots_.pop_back();
  rows_.push_back(std::move(live));
  return rows_.back().id;
}

std::vector<int64_t> DecodeStream::step() {
  torch::NoGradGuard no_grad;
  const int64_t max_len = model_->config().max_seq_len;
  std::vector<int64_t> ended, slots, tokens;
  std::vector<Live> going;
  std::vector<std::pair<size_t, bool>>
      fed;  // rows of `going` this step feeds, in row order; whether it ends their input
  for (auto& r : rows_) {
    if (!r.prompt.empty()) {  // joins below when its prompt fits
      going.push_back(std::move(r));
      continue;
    }
    bool more = r.produced < r.row.opt.max_tokens && engine_.length(r.slot) < max_len;
    if (more) {
      const auto id = pick_token(r.logits_V, r.row.opt, r.gen);
      more = id != r.row.opt.stop_token && r.row.on_token(static_cast<int>(id)) && ++r.produced < r.row.opt.max_tokens;
      if (more) slots.push_back(r.slot), tokens.push_back(id), fed.emplace_back(going.size(), true);
    }
    if (more) {
      going.push_back(std::move(r));
    } else {
      ended.push_back(r.id);
      engine_.clear(r.slot);
      free_slots_.push_back(r.slot);
    }
  }
  const auto room = static_cast<size_t>(engine_.slots() + DecodeEngine::kPrefillRows);
  for (size_t i = 0; i < going.size(); ++i) {  // prompts, up to kPrefillRows tokens of each a step, as room allows
    auto& prompt = going[i].prompt;
    const auto n = std::min({prompt.size(), static_cast<size_t>(DecodeEngine::kPrefillRows), room - tokens.size()});
    if (n == 0) continue;
    slots.insert(slots.end(), n, going[i].slot);
    tokens.insert(tokens.end(), prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n));
    prompt.erase(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n));
    fed.emplace_back(i, prompt.empty());
  }
  rows_ = std::move(going);
  if (!slots.empty()) {
    const auto logits = engine_.step(slots, tokens);  // a row per slot fed, in row order
    for (size_t i = 0; i < fed.size(); ++i)
      if (fed[i].second) rows_[fed[i].first].logits_V = logits[static_cast<int64_t>(i)];
  }
  return ended;
}

}  // namespace mf
