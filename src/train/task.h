// What the trainer needs from a task: the model, the training loss of batch (step, micro),
// a held-out evaluation, and what goes into checkpoints. "lm": the decoder on the text corpus;
// "classify": the ViT on Fashion-MNIST (model.task).
#pragma once
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "core/config.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "train/evaluate.h"

namespace mf {

struct Evaluation {
  std::vector<DomainLoss> losses;                     // per text domain, or one entry for the image split
  nlohmann::json metrics = nlohmann::json::object();  // e.g. accuracy
};

class Task {
 public:
  virtual ~Task() = default;
  virtual torch::nn::Module& module() = 0;
  virtual std::vector<std::shared_ptr<FeedForward>> feed_forwards() const = 0;
  virtual ParamCounts param_counts() const = 0;
  virtual void init_weights(uint64_t seed) = 0;
  // the task loss of training batch (step, micro); auxiliary losses go to `aux`
  virtual at::Tensor train_loss(int64_t step, int64_t micro, AuxLosses& aux) = 0;
  virtual Evaluation evaluate(const std::string& split) = 0;
  virtual int64_t items_per_micro_batch() const = 0;  // tokens or images
  virtual std::string item_name() const = 0;          // "tokens" or "images"
  virtual Metadata checkpoint_metadata() const = 0;   // architecture and sizes the config does not hold
  virtual std::string tokenizer_path() const { return ""; }
  virtual nlohmann::json summary_extra() const { return nlohmann::json::object(); }
  virtual TransformerLM* language_model() { return nullptr; }  // for the end-of-run text sample
};

std::unique_ptr<Task> make_task(const Config& cfg);

}  // namespace mf
