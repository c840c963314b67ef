#include "methods/unif/slots.h"

#include <algorithm>

#include "core/timing.h"
#include "data/images.h"
#include "data/prepare.h"
#include "io/model_io.h"
#include "model/moe_ffn.h"
#include "train/evaluate.h"

namespace mf {
namespace {

// Passes through, keeping the first `tokens` rows of what it saw.
class CaptureSlot : public FeedForward {
 public:
  CaptureSlot(std::shared_ptr<FeedForward> inner, torch::Tensor* kept_TD, int64_t tokens)
      : inner_(std::move(inner)), kept_(kept_TD), tokens_(tokens) {}
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override {
    const auto have = kept_->defined() ? kept_->size(0) : 0;
    if (have < tokens_) {
      auto x_TD = x.reshape({-1, x.size(-1)}).narrow(0, 0, std::min(tokens_ - have, x.numel() / x.size(-1)));
      *kept_ = have ? torch::cat({*kept_, x_TD.detach()}) : x_TD.detach().clone();
    }
    return inner_->forward(x, aux);
  }

 private:
  std::shared_ptr<FeedForward> inner_;
  torch::Tensor* kept_;
  int64_t tokens_;
};

}  // namespace

CapturedSlots capture_slots(const std::string& dir, const std::vector<int64_t>& layers, int64_t B,
                            const std::string& domain, int64_t windows, int64_t tokens) {
  CapturedSlots c;
  c.inputs_TD.resize(layers.size());
  const bool vision = checkpoint_config(dir).model.task == "classify";
  std::vector<std::shared_ptr<FeedForward>*> slots;
  LoadedClassifier vit;
  LoadedModel lm;
  if (vision) {
    vit = load_classifier(dir);
    for (auto i : layers) slots.push_back(&vit.model->blocks[static_cast<size_t>(i)]->mlp);
  } else {
    lm = load_model(dir);
    for (auto i : layers) slots.push_back(&lm.model->model->blocks[static_cast<size_t>(i)]->mlp);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    c.slots.push_back(*slots[i]);
    *slots[i] = std::make_shared<CaptureSlot>(c.slots.back(), &c.inputs_TD[i], tokens);
  }
  const auto moe = moe_layers(c.slots);
  double batches = 0;
  const auto after_batch = [&] {
    for (auto& m : moe) {
      const auto s = m->last_stats();
      const bool unif = !s.counts.empty();  // UniF-MoE counts b and k; its units are blocks
      c.blocks += unif ? s.mean_units_per_token : s.mean_units_per_token * static_cast<double>(B);
      c.k += unif ? s.counts[1].mean : s.mean_units_per_token;
      c.b += unif ? s.counts[0].mean : 0;
    }
    batches += static_cast<double>(moe.size());
  };
  if (vision) {
    ImageDataset data(vit.cfg.data.images_dir, vit.cfg.data.val_images, image_classes(vit.cfg.data));
    vit.model->eval();
    evaluate_classifier(*vit.model, data, "test", windows * 16, 500, false, after_batch);
  } else {
    const auto corpus = corpus_for_model(lm.cfg.data.dir, lm.cfg.model.vocab_size);
    if (!corpus) throw std::runtime_error("repro unif: no prepared corpus at " + lm.cfg.data.dir);
    const auto& names = corpus->domains();
    const auto d = std::find(names.begin(), names.end(), domain);
    if (d == names.end())
      throw std::runtime_error("repro unif: the corpus at " + lm.cfg.data.dir + " has no " + domain);
    const auto batch =
        fixed_windows(corpus->tokens(static_cast<size_t>(d - names.begin()), "val"), lm.cfg.train.seq_len, windows);
    torch::NoGradGuard g;
    lm.model->eval();
    for (int64_t i = 0; i < windows; i += 16) {
      AuxLosses aux;
      lm.model->forward(batch.inputs.narrow(0, i, std::min<int64_t>(16, windows - i)), aux);
      after_batch();
    }
  }
  if (batches > 0) c.blocks /= batches, c.k /= batches, c.b /= batches;
  if (moe.empty()) c.blocks = static_cast<double>(B), c.k = 1;  // the dense FFN: one whole expert
  return c;
}

std::map<std::string, std::vector<double>> time_in_rounds(const std::map<std::string, CapturedSlots>& arms,
                                                          int rounds) {
  torch::NoGradGuard g;
  auto run = [](const CapturedSlots& c) {
    for (size_t i = 0; i < c.slots.size(); ++i) {
      AuxLosses aux;
      c.slots[i]->forward(c.inputs_TD[i], aux);
    }
  };
  for (const auto& [name, c] : arms) {
    for (auto& s : c.slots) s->eval();
    run(c);  // warm-up
  }
  std::map<std::string, std::vector<double>> out;
  for (int r = 0; r < rounds; ++r)
    for (const auto& [name, c] : arms) out[name].push_back(seconds([&] { run(c); }));
  return out;
}

}  // namespace mf
