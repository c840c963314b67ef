#include "train/task.h"

#include "data/images.h"
#include "data/shards.h"
#include "model/fused_loss.h"
#include "model/vit.h"

namespace mf {
namespace {

// What every task does through its model (TransformerLM or VisionTransformer).
template <class Model>
class ModelTask : public Task {
 public:
  torch::nn::Module& module() override { return *model_; }
  std::vector<std::shared_ptr<FeedForward>> feed_forwards() const override { return model_->feed_forwards(); }
  ParamCounts param_counts() const override { return model_->param_counts(); }
  void init_weights(uint64_t seed) override { model_->init_weights(seed); }

 protected:
  Model model_{nullptr};
};

class LanguageModelTask : public ModelTask<TransformerLM> {
 public:
  explicit LanguageModelTask(const Config& c)
      : cfg_(c),
        corpus_(c.data.dir),
        sampler_(corpus_,
                 {c.data.weight_dictionary, c.data.weight_scripture, c.data.weight_technical, c.data.weight_quotations},
                 c.train.seq_len, static_cast<uint64_t>(c.train.seed)) {
    ModelConfig mc = c.model;
    mc.vocab_size = corpus_.vocab_size();
    model_ = TransformerLM(mc);
  }
  at::Tensor train_loss(int64_t step, int64_t micro, AuxLosses& aux) override {
    auto batch = sampler_.sample(step, micro, cfg_.train.batch_size);
    const auto h = model_->hidden(batch.inputs, aux);  // the head fused into the loss: no [N, V] logits
    return fused_lm_loss(h.reshape({-1, h.size(-1)}), model_->head_weight(), batch.targets.reshape({-1}));
  }
  Evaluation evaluate(const std::string& split) override {
    return {evaluate_domains(model_, corpus_, split, cfg_.train.seq_len, cfg_.eval.windows, cfg_.eval.batch_size)};
  }
  int64_t items_per_micro_batch() const override { return cfg_.train.batch_size * cfg_.train.seq_len; }
  std::string item_name() const override { return "tokens"; }
  Metadata checkpoint_metadata() const override {
    return {{"moeforge.architecture", "llama"}, {"moeforge.vocab_size", std::to_string(corpus_.vocab_size())}};
  }
  std::string tokenizer_path() const override { return corpus_.tokenizer_path(); }
  nlohmann::json summary_extra() const override {
    nlohmann::json j;
    j["unigram_entropy_nats"] = corpus_.manifest().value("unigram_entropy_nats", 0.0);
    return j;
  }
  TransformerLM* language_model() override { return &model_; }

 private:
  const Config& cfg_;
  PreparedCorpus corpus_;
  BatchSampler sampler_;
};

class ClassifyTask : public ModelTask<VisionTransformer> {
 public:
  explicit ClassifyTask(const Config& c)
      : cfg_(c),
        data_(c.data.images_dir, c.data.val_images, image_classes(c.data)),
        sampler_(data_, static_cast<uint64_t>(c.train.seed), c.data.augment, c.data.crop_padding, c.data.erase_prob) {
    model_ = VisionTransformer(c.model);
  }
  at::Tensor train_loss(int64_t step, int64_t micro, AuxLosses& aux) override {
    auto batch = sampler_.sample(step, micro, cfg_.train.batch_size);
    return classify_loss(model_->forward(batch.images, aux), batch.labels, cfg_.train.label_smoothing);
  }
  Evaluation evaluate(const std::string& split) override {
    auto r =
        evaluate_classifier(*model_, data_, split, 0, cfg_.eval.batch_size, cfg_.eval.flip_average);  // the whole split
    Evaluation e;
    e.losses.push_back({"images", r.loss, r.count});
    e.metrics["accuracy"] = r.accuracy;
    return e;
  }
  int64_t items_per_micro_batch() const override { return cfg_.train.batch_size; }
  std::string item_name() const override { return "images"; }
  Metadata checkpoint_metadata() const override {
    return {{"moeforge.architecture", "vit"}, {"moeforge.vocab_size", "0"}};
  }

 private:
  const Config& cfg_;
  ImageDataset data_;
  ImageSampler sampler_;
};

}  // namespace

std::unique_ptr<Task> make_task(const Config& cfg) {
  if (cfg.model.task == "classify") return std::make_unique<ClassifyTask>(cfg);
  return std::make_unique<LanguageModelTask>(cfg);
}

}  // namespace mf
