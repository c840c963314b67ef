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
  Live live{next_id_++, free_slots_.back(), 0, std::move(row), at::make_generator<at::CPUGeneratorImpl>(seed), {}};
  if (live.row.opt.max_tokens > 0) {  // a row asking for nothing ends at the next step, unread
    std::vector<LayerCache> caches;
    AuxLosses aux;
    const auto prompt = prompt_batch({live.row}, model_->config().max_seq_len);
    live.logits_V = model_->forward(prompt, aux, &caches).select(1, -1)[0].to(torch::kFloat32);
    engine_.load(live.slot, caches, 0);
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
  for (auto& r : rows_) {
    bool more = r.produced < r.row.opt.max_tokens && engine_.length(r.slot) < max_len;
    if (more) {
      const auto id = pick_token(r.logits_V, r.row.opt, r.gen);
      more = id != r.row.opt.stop_token && r.row.on_token(static_cast<int>(id)) && ++r.produced < r.row.opt.max_tokens;
      if (more) slots.push_back(r.slot), tokens.push_back(id);
    }
    if (more) {
      going.push_back(std::move(r));
    } else {
      ended.push_back(r.id);
      engine_.clear(r.slot);
      free_slots_.push_back(r.slot);
    }
  }
  rows_ = std::move(going);
  if (!rows_.empty()) {
    const auto logits = engine_.step(slots, tokens);
    for (size_t i = 0; i < rows_.size(); ++i) rows_[i].logits_V = logits[static_cast<int64_t>(i)];
  }
  return ended;
}

}  // namespace mf
