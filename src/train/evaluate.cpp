#include "train/evaluate.h"

#include "model/fused_loss.h"

#include "data/images.h"
#include "model/vit.h"

namespace mf {

namespace {
// mean next-token loss over the windows of `batch`
double windows_loss(TransformerLM& model, const Batch& batch, int64_t batch_size,
                    const std::function<void()>& after_batch) {
  const int64_t windows = batch.inputs.size(0);
  double sum = 0;
  for (int64_t b = 0; b < windows; b += batch_size) {
    const int64_t n = std::min(batch_size, windows - b);
    AuxLosses aux;
    const auto h = model->hidden(batch.inputs.narrow(0, b, n), aux);
    if (after_batch) after_batch();
    const auto loss =
        fused_lm_loss(h.reshape({-1, h.size(-1)}), model->head_weight(), batch.targets.narrow(0, b, n).reshape({-1}));
    sum += loss.item<double>() * static_cast<double>(n);
  }
  return sum / static_cast<double>(windows);
}

// eval mode and no gradients around one windows_loss per domain
std::vector<DomainLoss> per_domain(TransformerLM& model, size_t domains, const std::function<std::string(size_t)>& name,
                                   const std::function<Batch(size_t)>& windows_of, int64_t tokens, int64_t batch_size,
                                   const std::function<void()>& after_batch) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  std::vector<DomainLoss> out;
  for (size_t d = 0; d < domains; ++d)
    out.push_back({name(d), windows_loss(model, windows_of(d), batch_size, after_batch), tokens});
  model->train(was_training);
  return out;
}
}  // namespace

std::vector<DomainLoss> evaluate_domains(TransformerLM& model, const PreparedCorpus& corpus, const std::string& split,
                                         int64_t seq_len, int64_t windows, int64_t batch_size,
                                         const std::function<void()>& after_batch) {
  return per_domain(
      model, corpus.domains().size(), [&](size_t d) { return corpus.domains()[d]; },
      [&](size_t d) { return fixed_windows(corpus.tokens(d, split), seq_len, windows); }, windows * seq_len, batch_size,
      after_batch);
}

std::vector<DomainLoss> evaluate_streams(TransformerLM& model,
                                         const std::vector<std::pair<std::string, std::vector<int>>>& streams,
                                         int64_t seq_len, int64_t windows, int64_t batch_size,
                                         const std::function<void()>& after_batch) {
  return per_domain(
      model, streams.size(), [&](size_t d) { return streams[d].first; },
      [&](size_t d) { return fixed_windows(streams[d].second, seq_len, windows); }, windows * seq_len, batch_size,
      after_batch);
}

ClassifierEvaluation evaluate_classifier(VisionTransformerImpl& model, const ImageDataset& data,
                                         const std::string& split, int64_t images, int64_t batch_size,
                                         bool flip_average, const std::function<void()>& after_batch) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t n = data.split(split).images.size(0);
  ClassifierEvaluation r;
  r.count = images > 0 ? std::min(images, n) : n;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t b = 0; b < r.count; b += batch_size) {
    auto batch = image_range(data, split, b, std::min(batch_size, r.count - b));
    auto logits = classify_logits(model, batch.images, flip_average, after_batch);
    const auto m = batch.labels.size(0);
    loss_sum += classify_loss(logits, batch.labels).item<double>() * static_cast<double>(m);
    auto pred = logits.argmax(-1);
    correct += (pred == batch.labels).sum().item<int64_t>();
    r.predictions.insert(r.predictions.end(), pred.data_ptr<int64_t>(), pred.data_ptr<int64_t>() + m);
    r.labels.insert(r.labels.end(), batch.labels.data_ptr<int64_t>(), batch.labels.data_ptr<int64_t>() + m);
  }
  model.train(was_training);
  r.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, r.count));
  r.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, r.count));
  return r;
}

double mean_loss(const std::vector<DomainLoss>& losses) {
  double s = 0;
  for (auto& l : losses) s += l.loss;
  return losses.empty() ? 0 : s / static_cast<double>(losses.size());
}

}  // namespace mf
