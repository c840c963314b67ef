// Hugging Face decoder architectures: how each one's config.json maps onto our ModelConfig and
// how its tensor names map onto ours. One small file per architecture (llama.cpp, mixtral.cpp,
// qwen2_moe.cpp, qwen3_moe.cpp, olmoe.cpp); what each matched is in README.md.
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/config.h"

namespace mf::hf {

// config.json read with errors that name the file and the key.
class ConfigReader {
 public:
  ConfigReader(nlohmann::json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}
  int64_t integer(const std::string& key) const;  // required
  int64_t integer(const std::string& key, int64_t fallback) const;
  // The same within [lo, hi] (a value outside is an error naming the key, before anything is
  // allocated from it).
  int64_t integer_in(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t integer_in(const std::string& key, int64_t lo, int64_t hi, int64_t fallback) const;
  // A finite number > 0 (and < below, when given).
  double positive(const std::string& key, double fallback, double below = INFINITY) const;
  double number(const std::string& key, double fallback) const;
  bool flag(const std::string& key, bool fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> integers(const std::string& key) const;  // [] when absent or null
  bool is_null(const std::string& key) const { return !j_.contains(key) || j_[key].is_null(); }
  // A key whose other values change semantics we do not implement: must be absent, null or `allowed`.
  void require(const std::string& key, const nlohmann::json& allowed, const std::string& why) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& file() const { return file_; }

 private:
  const nlohmann::json& at(const std::string& key) const;
  nlohmann::json j_;
  std::string file_;
};

struct Arch {
  std::string model_type, hf_class;
  std::string moe_module = "mlp";                                            // block_sparse_moe for Mixtral
  std::string w_gate = "gate_proj", w_up = "up_proj", w_down = "down_proj";  // w1, w3, w2 for Mixtral
  bool moe = true;
  void (*read)(const ConfigReader& r, ModelConfig& m) = nullptr;     // the architecture's own keys
  void (*write)(const ModelConfig& m, nlohmann::json& j) = nullptr;  // and back; throws ConfigError if m does not fit
};

const std::vector<const Arch*>& archs();
const Arch& arch_named(const std::string& model_type, const std::string& source);  // FormatError lists the known ones
// The architecture a model of ours exports to by default: LLaMA if dense, else by its flags.
const Arch& arch_for(const ModelConfig& m);

// The LLaMA keys every architecture shares: sizes, heads (head_dim), rope_theta, rms_norm_eps,
// max_position_embeddings, vocab_size, tie_word_embeddings, hidden_act = silu, no rope_scaling.
// What transformers' config class of an architecture assumes for a key config.json leaves out.
struct CommonDefaults {
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
};
void read_common(const ConfigReader& r, ModelConfig& m, const CommonDefaults& d = {});
void write_common(const ModelConfig& m, nlohmann::json& j);
// Qwen's sparse-layer keys: decoder_sparse_step and mlp_only_layers -> model.moe.layers.
void read_sparse_layers(const ConfigReader& r, ModelConfig& m);
void write_sparse_layers(const ModelConfig& m, nlohmann::json& j);
// The routed experts' keys: count (`experts_key`), num_experts_per_tok, width (`width_key`),
// norm_topk_prob (model.moe.renormalize), router_aux_loss_coef; every MoE architecture's.
void read_moe(const ConfigReader& r, ModelConfig& m, const std::string& experts_key, const std::string& width_key);
void write_moe(const ModelConfig& m, nlohmann::json& j, const std::string& experts_key, const std::string& width_key);
// The checks every MoE export shares: softmax top-k routing, SwiGLU experts without biases, no selection bias step.
void check_moe_exportable(const ModelConfig& m, const std::string& arch);

}  // namespace mf::hf
