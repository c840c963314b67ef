// A model's weights read one tensor at a time under our names, from a checkpoint of ours or from
// a Hugging Face directory (each of our tensors built from its Hugging Face tensors on demand, as
// `import` does): what streamed commands (export --format gguf, umoe) read, so their peak memory
// is one tensor (one block's stacked experts), not the model.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "io/safetensors.h"

namespace mf {

struct WeightSource {
  std::string dir;      // the checkpoint or Hugging Face directory
  std::string hf_type;  // a Hugging Face directory's model_type; "" for a checkpoint
  Config config;
  Metadata metadata;              // a checkpoint's; for a Hugging Face directory, what `import` writes
  std::vector<TensorSpec> specs;  // every tensor: a checkpoint's in name order, else the model's order
  std::string tokenizer;          // "" when there is none
  std::function<at::Tensor(const TensorSpec&)> read;  // as stored in a checkpoint; float32 from Hugging Face
  int64_t bytes = 0;                                  // the safetensors files on disk
  at::ScalarType stored = at::kFloat;                 // a Hugging Face directory's dtype on disk (its embedding's)
};
WeightSource open_weights(const std::string& path);

struct CheckpointContents;
// Writes `contents` as a checkpoint at `out`, or when `src` is a Hugging Face directory as a Hugging
// Face directory in its dtype (architecture `arch`, "" = by the model's flags), through a checkpoint
// beside `out` that is removed after (and on failure). Returns the architecture ("" = a checkpoint).
std::string write_like_source(const WeightSource& src, const CheckpointContents& contents, const std::string& out,
                              const std::string& arch);

// Copies the source's tensors "<prefix><name>" into `module`'s parameters and buffers (one at a
// time); a tensor under `prefix` the module lacks is a FormatError naming it.
void load_module(torch::nn::Module& module, const WeightSource& src, const std::string& prefix);

}  // namespace mf
