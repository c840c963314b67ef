#include "train/evaluable.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>

#include "data/images.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/model_io.h"
#include "train/finite.h"

namespace mf {
namespace {
void require_finite(const torch::nn::Module& model, const std::string& checkpoint) {
  if (const auto bad = first_nonfinite(model_tensors(model)); !bad.empty())
    throw std::runtime_error(fmt::format(
        "{}: tensor '{}' holds NaN or infinity (a diverged run?); refusing to evaluate it", checkpoint, bad));
}
}  // namespace

Evaluable open_evaluable(const std::string& checkpoint, int64_t windows, const std::string& data_dir, int64_t seq_len,
                         at::ScalarType weights) {
  Evaluable e;
  e.cfg = checkpoint_config(checkpoint);
  if (e.cfg.model.task == "classify") {
    std::shared_ptr<VisionTransformerImpl> model = load_classifier(checkpoint).model.ptr();
    require_finite(*model, checkpoint);
    auto data = std::make_shared<ImageDataset>(data_dir.empty() ? e.cfg.data.images_dir : data_dir,
                                               e.cfg.data.val_images, image_classes(e.cfg.data));
    e.ffns = model->feed_forwards();
    const int64_t images = windows > 0 ? windows * 16 : 0;
    const bool flip = e.cfg.eval.flip_average;
    e.evaluate = [model, data, images, flip](const std::string& split, const std::function<void()>& after_batch) {
      auto r = evaluate_classifier(*model, *data, split, images, 256, flip, after_batch);
      return std::vector<DomainLoss>{DomainLoss{"images", r.loss, r.count}};
    };
    return e;
  }
  const auto l = load_model(checkpoint, weights);
  auto model = l.model;
  require_finite(*model, checkpoint);
  e.ffns = model->feed_forwards();
  const int64_t len = seq_len > 0 ? seq_len : e.cfg.train.seq_len;
  const auto dir = data_dir.empty() ? e.cfg.data.dir : data_dir;
  if (std::shared_ptr<PreparedCorpus> corpus = corpus_for_model(dir, e.cfg.model.vocab_size)) {
    e.evaluate = [model, corpus, len, windows](const std::string& split, const std::function<void()>& after_batch) {
      auto m = model;
      return evaluate_domains(m, *corpus, split, len, windows, 16, after_batch);
    };
    return e;
  }
  // a model with its own tokenizer (a Hugging Face one): the corpus's documents, re-encoded
  if (l.tokenizer.empty() || !std::filesystem::exists(l.tokenizer))
    throw std::runtime_error(
        fmt::format("no corpus at '{}' fits {}'s vocabulary of {}, and it has no tokenizer to "
                    "encode the corpus documents with",
                    dir, checkpoint, e.cfg.model.vocab_size));
  spdlog::info("evaluating on the corpus documents encoded with {}", l.tokenizer);
  auto tok = std::make_shared<Tokenizer>(l.tokenizer);
  auto streams = std::make_shared<std::map<std::string, std::vector<std::pair<std::string, std::vector<int>>>>>();
  e.evaluate = [model, tok, streams, data = e.cfg.data, len, windows](const std::string& split,
                                                                      const std::function<void()>& after_batch) {
    auto& s = (*streams)[split];
    if (s.empty()) s = retokenized_split(data, *tok, split);
    auto m = model;
    return evaluate_streams(m, s, len, windows, 16, after_batch);
  };
  return e;
}

}  // namespace mf
