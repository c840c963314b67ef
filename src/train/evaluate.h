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
double mean_loss(const std::vector<DomainLoss>& losses);

}  // namespace mf
