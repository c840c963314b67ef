// Per-domain validation loss on fixed windows.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "data/shards.h"
#include "model/transformer.h"

namespace mf {

struct DomainLoss {
  std::string domain;
  double loss = 0;  // mean next-token cross entropy (nats)
  int64_t tokens = 0;
};

// `after_batch` runs after every forward pass (e.g. to read routing statistics).
std::vector<DomainLoss> evaluate_domains(TransformerLM& model, const PreparedCorpus& corpus, const std::string& split,
                                         int64_t seq_len, int64_t windows, int64_t batch_size,
                                         const std::function<void()>& after_batch = {});
// The same on token streams of the caller's (e.g. documents re-tokenized for a Hugging Face model).
std::vector<DomainLoss> evaluate_streams(TransformerLM& model,
                                         const std::vector<std::pair<std::string, std::vector<int>>>& streams,
                                         int64_t seq_len, int64_t windows, int64_t batch_size,
                                         const std::function<void()>& after_batch = {});
double mean_loss(const std::vector<DomainLoss>& losses);

struct ClassifierEvaluation {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
  std::vector<int64_t> predictions, labels;  // per image, in split order
};
class ImageDataset;
class VisionTransformerImpl;
// The first `images` images of `split` (all of them when images <= 0 or larger than the split);
// flip_average: predict from the mean logits of each image and its mirror image (`after_batch` then
// runs after each of the two forward passes).
ClassifierEvaluation evaluate_classifier(VisionTransformerImpl& model, const ImageDataset& data,
                                         const std::string& split, int64_t images, int64_t batch_size,
                                         bool flip_average = false, const std::function<void()>& after_batch = {});

}  // namespace mf
