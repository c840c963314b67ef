// A trained model of either task, opened with its held-out data, as the analyses need it: its
// FFN slots and an evaluation on a split that calls back after every forward pass (to read
// routing statistics). `moeforge usage` / `probe` and the repro drivers take one.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/config.h"
#include "model/layers.h"
#include "train/evaluate.h"

namespace mf {

struct Evaluable {
  Config cfg;
  std::vector<std::shared_ptr<FeedForward>> ffns;
  // per-domain (LM) or single-entry (classifier) losses on `split`
  std::function<std::vector<DomainLoss>(const std::string& split, const std::function<void()>& after_batch)> evaluate;
};

// A checkpoint (directory, model.safetensors, or run directory). LM: `windows` windows of
// train.seq_len tokens per domain from `data_dir` (default: the config's data.dir);
// classifier: the first `windows` x 16 images of the split (all when windows <= 0).
// A model whose vocabulary is not the corpus's (a Hugging Face one) is evaluated on the same
// documents encoded with its own tokenizer. `seq_len` 0 = train.seq_len. `weights`: the dtype an
// LM's weights are held in (model/weight_dtype.h; a classifier's stay float32).
Evaluable open_evaluable(const std::string& checkpoint, int64_t windows, const std::string& data_dir = "",
                         int64_t seq_len = 0, at::ScalarType weights = at::kFloat);

}  // namespace mf
