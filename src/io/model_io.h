// Model tensors in and out of safetensors, and models loaded back from checkpoints.
#pragma once
#include <torch/nn/module.h>

#include <string>

#include "core/config.h"
#include "io/safetensors_shards.h"
#include "model/transformer.h"
#include "model/vit.h"

namespace mf {

// every parameter and buffer (e.g. the router selection bias) by its full name
NamedTensors model_tensors(const torch::nn::Module& model);
// copies the checkpoint's tensors into the model; names and shapes must match
void load_model_tensors(torch::nn::Module& model, const SafetensorsData& st);

// The same from a streamed file, every name prefixed by `prefix` (e.g. "model.layers.3."): one
// tensor in memory at a time; a tensor under `prefix` the module lacks is an error. A parameter
// the module holds in bf16 is rounded to it from the stored float32.
void load_module_tensors(torch::nn::Module& module, const SafetensorsShards& file, const std::string& prefix);

// The config a checkpoint was trained with (from its model.safetensors metadata). Keys that
// have moved since (the flat model.moe.pool_* / latent keys) are read through their aliases.
Config checkpoint_config(const std::string& ckpt_path);

// The tokenizer file of a checkpoint, run or Hugging Face directory (see tokenizer_in).
std::string model_tokenizer(const std::string& path);

struct LoadedModel {
  Config cfg;
  TransformerLM model{nullptr};
  std::string tokenizer;
};
// A checkpoint directory, its model.safetensors, or a run directory (its latest checkpoint).
// A language model; an image classifier checkpoint is an error that says so. `weights` kBFloat16
// holds the large matrices in bf16 (model/weight_dtype.h), each rounded as it is read.
LoadedModel load_model(const std::string& path, at::ScalarType weights = at::kFloat);

// model.safetensors metadata of a checkpoint at step 0 with config `cfg` (import, a converted Hugging
// Face directory, a benchmark's scratch model): moeforge.config, .step, .vocab_size, .architecture.
Metadata step0_metadata(const Config& cfg, const std::string& architecture);

// The weights of a checkpoint as stored, or of a Hugging Face directory under our names (converted
// in memory, with the metadata an imported checkpoint carries): what surgery commands rewrite.
SafetensorsData model_weights(const std::string& path);

// For benchmarks: a TOML config gives a randomly initialised model of that shape (seed
// train.seed, vocabulary data.vocab_size) with the tokenizer of its data.dir ("" when the corpus
// is not prepared); anything else is load_model(source). `weights` as in load_model.
LoadedModel load_model_or_shape(const std::string& source, at::ScalarType weights = at::kFloat);

struct LoadedClassifier {
  Config cfg;
  VisionTransformer model{nullptr};
};
LoadedClassifier load_classifier(const std::string& path);  // model.task = "classify"

}  // namespace mf
