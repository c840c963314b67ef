// A model's weights read one tensor at a time under our names, from a checkpoint of ours or from
// a Hugging Face directory (each of our tensors built from its Hugging Face tensors on demand, as
// `import` does): what streamed commands (export --format gguf, umoe) read, so their peak memory
// is one tensor (one block's stacked experts), not the model.
#pragma once
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
};
WeightSource open_weights(const std::string& path);

}  // namespace mf
