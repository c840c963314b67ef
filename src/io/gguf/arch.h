// What llama.cpp calls our models: its architecture for each Hugging Face one we export
// (mixtral -> llama with merged expert tensors), the metadata keys it reads, the tensor names
// it loads, and what it cannot hold (refused by name). Learned from llama.cpp's
// src/llama-arch.cpp and src/models/*.cpp (the build node-llama-cpp 3.21.1 ships).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "io/gguf/writer.h"

namespace mf::gguf {

struct Arch {
  std::string name;       // llama.cpp's: llama | qwen2moe | qwen3moe | olmoe
  bool interleaved_rope;  // llama.cpp's "normal" RoPE rotates (x0, x1) pairs: q and k rows permuted
  bool renormalizes;      // llama.cpp renormalises the top-k weights (its MoE graph hard-codes it)
  bool needs_output;      // output.weight required (a tied head is written out)
  bool dense_allowed;     // all blocks dense; otherwise every block must be MoE
};

// The llama.cpp architecture of Hugging Face `model_type` (llama, mixtral, qwen2_moe, qwen3_moe,
// olmoe); ConfigError naming the reason when `m` has something it cannot hold.
const Arch& arch_for(const std::string& hf_type, const ModelConfig& m);

// `{arch}.*` and general.* metadata for `m`.
void write_hparams(Writer& w, const Arch& a, const ModelConfig& m);

// The GGUF tensors our tensor `name` becomes (none for a zero selection bias), each float32 in
// LibTorch order. ConfigError for a tensor llama.cpp has no place for.
std::vector<std::pair<std::string, at::Tensor>> gguf_tensors(const Arch& a, const ModelConfig& m,
                                                             const std::string& name, const at::Tensor& t);

// The storage of one GGUF tensor under `--dtype`: norms, biases and the router stay f32, q8_0
// falls back to f16 for rows that are not a multiple of 32.
Type storage(const std::string& gguf_name, at::IntArrayRef shape, Type dtype);

}  // namespace mf::gguf
