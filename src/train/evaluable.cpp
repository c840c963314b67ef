#include "train/evaluable.h"

#include "data/images.h"
#include "data/shards.h"
#include "io/model_io.h"

namespace mf {

Evaluable open_evaluable(const std::string& checkpoint, int64_t windows, const std::string& data_dir) {
  Evaluable e;
  e.cfg = checkpoint_config(checkpoint);
  if (e.cfg.model.task == "classify") {
    std::shared_ptr<VisionTransformerImpl> model = load_classifier(checkpoint).model.ptr();
    auto data =
        std::make_shared<ImageDataset>(data_dir.empty() ? e.cfg.data.images_dir : data_dir, e.cfg.data.val_images);
    e.ffns = model->feed_forwards();
    const int64_t images = windows > 0 ? windows * 16 : 0;
    e.evaluate = [model, data, images](const std::string& split, const std::function<void()>& after_batch) {
      auto r = evaluate_classifier(*model, *data, split, images, 256, after_batch);
      return std::vector<DomainLoss>{DomainLoss{"images", r.loss, r.count}};
    };
    return e;
  }
  auto model = load_model(checkpoint).model;
  auto corpus = std::make_shared<PreparedCorpus>(data_dir.empty() ? e.cfg.data.dir : data_dir);
  if (corpus->vocab_size() != e.cfg.model.vocab_size)
    throw std::runtime_error("the corpus tokenizer differs from the checkpoint's");
  e.ffns = model->feed_forwards();
  const int64_t seq_len = e.cfg.train.seq_len;
  e.evaluate = [model, corpus, seq_len, windows](const std::string& split, const std::function<void()>& after_batch) {
    auto m = model;
    return evaluate_domains(m, *corpus, split, seq_len, windows, 16, after_batch);
  };
  return e;
}

}  // namespace mf
