#include "train/evaluate.h"

namespace mf {

std::vector<DomainLoss> evaluate_domains(TransformerLM& model, const PreparedCorpus& corpus, const std::string& split,
                                         int64_t seq_len, int64_t windows, int64_t batch_size,
                                         const std::function<void()>& after_batch) {
  torch::NoGradGuard no_grad;
  bool was_training = model->is_training();
  model->eval();
  std::vector<DomainLoss> out;
  for (size_t d = 0; d < corpus.domains().size(); ++d) {
    auto batch = fixed_windows(corpus.tokens(d, split), seq_len, windows);
    double sum = 0;
    for (int64_t b = 0; b < windows; b += batch_size) {
      int64_t n = std::min(batch_size, windows - b);
      auto logits = model->forward(batch.inputs.narrow(0, b, n));
      if (after_batch) after_batch();
      sum += lm_loss(logits, batch.targets.narrow(0, b, n)).item<double>() * static_cast<double>(n);
    }
    out.push_back({corpus.domains()[d], sum / static_cast<double>(windows), windows * seq_len});
  }
  model->train(was_training);
  return out;
}

double mean_loss(const std::vector<DomainLoss>& losses) {
  double s = 0;
  for (auto& l : losses) s += l.loss;
  return losses.empty() ? 0 : s / static_cast<double>(losses.size());
}

}  // namespace mf
