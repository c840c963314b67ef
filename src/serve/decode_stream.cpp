#include "serve/decode_stream.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

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
    const auto prompt = prompt_batch({live.row}, model_->config().max_seq_len);
    if (prompt.size(1) <= DecodeEngine::kPrefillRows) {  // fed in the next step, beside the others
      live.prompt.assign(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
    } else {  // as decode_rows does: the modules, then the engine takes the cache
      std::vector<LayerCache> caches;
      AuxLosses aux;
      live.logits_V = model_->forward(prompt, aux, &caches).select(1, -1)[0].to(torch::kFloat32);
      engine_.load(live.slot, caches, 0);
    }
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
  std::vector<size_t> fed;  // rows of `going` whose logits this step computes, in row order
  for (auto& r : rows_) {
    if (!r.prompt.empty()) {  // joins below when its prompt fits
      going.push_back(std::move(r));
      continue;
    }
    bool more = r.produced < r.row.opt.max_tokens && engine_.length(r.slot) < max_len;
    if (more) {
      const auto id = pick_token(r.logits_V, r.row.opt, r.gen);
      more = id != r.row.opt.stop_token && r.row.on_token(static_cast<int>(id)) && ++r.produced < r.row.opt.max_tokens;
      if (more) slots.push_back(r.slot), tokens.push_back(id), fed.push_back(going.size());
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
  for (size_t i = 0; i < going.size(); ++i) {
    auto& prompt = going[i].prompt;
    if (prompt.empty() || tokens.size() + prompt.size() > room) continue;
    slots.insert(slots.end(), prompt.size(), going[i].slot);
    tokens.insert(tokens.end(), prompt.begin(), prompt.end());
    fed.push_back(i);
    prompt.clear();
  }
  rows_ = std::move(going);
  if (!slots.empty()) {
    const auto logits = engine_.step(slots, tokens);
    for (size_t i = 0; i < fed.size(); ++i) rows_[fed[i]].logits_V = logits[static_cast<int64_t>(i)];
  }
  return ended;
}

}  // namespace mf
