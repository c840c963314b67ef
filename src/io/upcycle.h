// Sparse upcycling: chosen dense FFN blocks of a trained checkpoint become MoE blocks whose
// experts are copies of the dense FFN (SwiGLU: gate and up rows stacked as gate_up_proj;
// GELU: fc1 / fc2 with their biases). Routers get the method's initialisation (the
// parameter roles: normal, or orthonormal rows for UniF-MoE); everything else is copied
// bit for bit. The result is a normal checkpoint that `train --init-from` fine-tunes.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf {

struct UpcycleOptions {
  std::vector<int64_t> layers;    // blocks to convert (0-based)
  std::string method = "topk";    // a preset: topk | topp | those methods register (unif)
  int64_t experts = 4;            // routed experts K (UniF-MoE: residual experts; its shared expert comes on top)
  int64_t top_k = 2;              // topk
  double top_p = 0.5;             // topp: cumulative mass
  int64_t blocks = 8;             // a method that splits experts into blocks (unif): B
  double noise = 0;               // each copied weight gets noise * std(W) * N(0, 1) (0 = exact copies)
  uint64_t seed = 0;              // router initialisation and noise
  std::vector<std::string> sets;  // further KEY=VALUE overrides of the upcycled config
};

// "1,3" -> {1, 3}; anything else is a ConfigError naming `option`
std::vector<int64_t> parse_block_list(const std::string& text, const std::string& option);

// A conversion preset: the overrides (KEY=VALUE) that give the upcycled blocks their kind.
// "topk" and "topp" are built in; a method registers its own (UniF-MoE: "unif").
using UpcyclePreset = std::function<std::vector<std::string>(const UpcycleOptions&)>;
void register_upcycle_method(const std::string& name, UpcyclePreset preset);
std::vector<std::string> upcycle_methods();

// The upcycled model's config: the dense config with model.ffn = "moe" on the chosen blocks
// (model.moe.dense_ffn keeps the others as they were) and the method's keys.
Config upcycled_config(const Config& dense, const UpcycleOptions& opt);

struct UpcycleReport {
  Config config;
  int64_t copied = 0, converted = 0;  // tensors copied as they are; dense FFN tensors turned into experts
  std::string hf_arch;                // the Hugging Face architecture written ("" = our checkpoint)
};

// Reads the dense model at `in` (a checkpoint, run or Hugging Face directory) tensor by tensor and
// writes the upcycled one to `out`: our checkpoint, or for a Hugging Face input a Hugging Face
// directory of the MoE architecture of its family, in its dtype (the export refuses by name what
// that architecture cannot hold). Peak memory: about one upcycled block's expert bank.
UpcycleReport upcycle(const std::string& in, const std::string& out, const UpcycleOptions& opt);

}  // namespace mf
