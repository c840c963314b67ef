#include "io/hf/arch.h"

#include <fmt/format.h>

#include "io/safetensors.h"

namespace mf::hf {

const Arch& llama_arch();
const Arch& mixtral_arch();
const Arch& qwen2_moe_arch();
const Arch& qwen3_moe_arch();
const Arch& olmoe_arch();

const std::vector<const Arch*>& archs() {
  static const std::vector<const Arch*> all = {&llama_arch(), &mixtral_arch(), &qwen2_moe_arch(), &qwen3_moe_arch(),
                                               &olmoe_arch()};
  return all;
}

const Arch& arch_named(const std::string& model_type, const std::string& source) {
  std::string known;
  for (auto* a : archs()) {
    if (a->model_type == model_type) return *a;
    known += (known.empty() ? "" : ", ") + a->model_type;
  }
  throw FormatError(fmt::format("{}: model_type \"{}\" is not supported (supported: {})", source, model_type, known));
}

const Arch& arch_for(const ModelConfig& m) {
  if (m.ffn != "moe") return llama_arch();
  if (m.qk_norm == "head") return qwen3_moe_arch();
  if (m.qk_norm == "full") return olmoe_arch();
  if (m.moe.shared_hidden > 0 || m.moe.n_shared > 0 || m.qkv_bias) return qwen2_moe_arch();
  return mixtral_arch();
}

const nlohmann::json& ConfigReader::at(const std::string& key) const {
  if (!j_.contains(key) || j_[key].is_null()) fail(key, "is missing");
  return j_[key];
}

void ConfigReader::fail(const std::string& key, const std::string& what) const {
  throw FormatError(fmt::format("{}: \"{}\" {}", file_, key, what));
}

int64_t ConfigReader::integer(const std::string& key) const {
  const auto& v = at(key);
  if (!v.is_number_integer()) fail(key, "must be an integer, not " + v.dump());
  return v.get<int64_t>();
}

int64_t ConfigReader::integer(const std::string& key, int64_t fallback) const {
  return is_null(key) ? fallback : integer(key);
}

int64_t ConfigReader::integer_in(const std::string& key, int64_t lo, int64_t hi) const {
  const int64_t v = integer(key);
  if (v < lo || v > hi) fail(key, fmt::format("= {} lies outside [{}, {}]", v, lo, hi));
  return v;
}

int64_t ConfigReader::integer_in(const std::string& key, int64_t lo, int64_t hi, int64_t fallback) const {
  return is_null(key) ? fallback : integer_in(key, lo, hi);
}

double ConfigReader::positive(const std::string& key, double fallback, double below) const {
  const double v = number(key, fallback);
  if (!(std::isfinite(v) && v > 0 && v < below))
    fail(key, fmt::format("= {} must be a finite number above 0{}", v,
                          std::isfinite(below) ? fmt::format(" and below {}", below) : std::string()));
  return v;
}

double ConfigReader::number(const std::string& key, double fallback) const {
  if (is_null(key)) return fallback;
  if (!j_[key].is_number()) fail(key, "must be a number, not " + j_[key].dump());
  return j_[key].get<double>();
}

bool ConfigReader::flag(const std::string& key, bool fallback) const {
  if (is_null(key)) return fallback;
  if (!j_[key].is_boolean()) fail(key, "must be true or false, not " + j_[key].dump());
  return j_[key].get<bool>();
}

std::string ConfigReader::text(const std::string& key, const std::string& fallback) const {
  if (is_null(key)) return fallback;
  if (!j_[key].is_string()) fail(key, "must be a string, not " + j_[key].dump());
  return j_[key].get<std::string>();
}

std::vector<int64_t> ConfigReader::integers(const std::string& key) const {
  std::vector<int64_t> out;
  if (is_null(key)) return out;
  if (!j_[key].is_array()) fail(key, "must be a list of integers, not " + j_[key].dump());
  for (auto& v : j_[key]) {
    if (!v.is_number_integer()) fail(key, "must be a list of integers, not " + j_[key].dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

void ConfigReader::require(const std::string& key, const nlohmann::json& allowed, const std::string& why) const {
  if (is_null(key) || j_[key] == allowed) return;
  fail(key, fmt::format("= {} is not supported ({}); only {}", j_[key].dump(), why,
                        allowed.is_null() ? std::string("null or absent") : allowed.dump() + " or null"));
}

void read_common(const ConfigReader& r, ModelConfig& m, const CommonDefaults& d) {
  constexpr int64_t kWidth = 1 << 16, kCount = 4096;  // far beyond any released model
  m.task = "lm";
  m.d_model = r.integer_in("hidden_size", 1, kWidth);
  m.n_layers = r.integer_in("num_hidden_layers", 1, kCount);
  m.n_heads = r.integer_in("num_attention_heads", 1, kCount);
  m.n_kv_heads = r.integer_in("num_key_value_heads", 1, m.n_heads, m.n_heads);
  if (m.n_heads % m.n_kv_heads != 0)
    r.fail("num_key_value_heads", fmt::format("= {} must divide num_attention_heads = {}", m.n_kv_heads, m.n_heads));
  m.vocab_size = r.integer_in("vocab_size", 1, 1 << 24);
  const int64_t head_dim = r.integer_in("head_dim", 1, kWidth, 0);
  if (head_dim == 0 && m.d_model % m.n_heads != 0)
    r.fail("num_attention_heads",
           fmt::format("= {} must divide hidden_size = {} when head_dim is absent", m.n_heads, m.d_model));
  m.head_dim = head_dim == m.d_model / m.n_heads && m.d_model % m.n_heads == 0 ? 0 : head_dim;
  m.rope_theta = r.positive("rope_theta", d.rope_theta);
  m.norm_eps = r.positive("rms_norm_eps", d.rms_norm_eps, 1.0);
  m.max_seq_len = r.integer_in("max_position_embeddings", 1, 1 << 24, 2048);
  m.tie_embeddings = r.flag("tie_word_embeddings", false);
  m.ffn_hidden = r.integer_in("intermediate_size", 1, 1 << 20, m.ffn_hidden);
  if (r.text("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be \"silu\" (SwiGLU FFNs)");
  r.require("rope_scaling", nullptr, "RoPE scaling");
  if (r.is_null("use_sliding_window"))
    r.require("sliding_window", nullptr, "sliding-window attention");
  else  // Qwen: sliding_window only counts when use_sliding_window is true
    r.require("use_sliding_window", false, "sliding-window attention");
  r.require("pretraining_tp", 1, "tensor-parallel slicing of the projections");
  r.require("mlp_bias", false, "biases in the FFN");
}

void write_common(const ModelConfig& m, nlohmann::json& j) {
  j["hidden_size"] = m.d_model;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads;
  j["head_dim"] = m.head_width();
  j["vocab_size"] = m.vocab_size;
  j["rope_theta"] = m.rope_theta;
  j["rms_norm_eps"] = m.norm_eps;
  j["max_position_embeddings"] = m.max_seq_len;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["intermediate_size"] = m.ffn_hidden;
  j["hidden_act"] = "silu";
  j["rope_scaling"] = nullptr;
}

void read_sparse_layers(const ConfigReader& r, ModelConfig& m) {
  const int64_t step = r.integer_in("decoder_sparse_step", 1, m.n_layers, 1);
  if (step < 1) r.fail("decoder_sparse_step", "must be >= 1");
  const auto dense = r.integers("mlp_only_layers");
  std::string list;
  int64_t sparse = 0;
  for (int64_t i = 0; i < m.n_layers; ++i)
    if (std::find(dense.begin(), dense.end(), i) == dense.end() && (i + 1) % step == 0)
      list += (list.empty() ? "" : ",") + std::to_string(i), ++sparse;
  if (sparse == 0) m.ffn = "swiglu";
  m.moe.layers = sparse == m.n_layers ? "all" : list;
}

void write_sparse_layers(const ModelConfig& m, nlohmann::json& j) {
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::json::array();
  for (int64_t i = 0; i < m.n_layers; ++i)
    if (!is_moe_layer(m, i)) j["mlp_only_layers"].push_back(i);
}

void read_moe(const ConfigReader& r, ModelConfig& m, const std::string& experts_key, const std::string& width_key) {
  m.ffn = "moe";
  m.moe.num_experts = r.integer_in(experts_key, 1, 1 << 14);
  m.moe.top_k = r.integer_in("num_experts_per_tok", 1, m.moe.num_experts);
  m.moe.expert_hidden = r.integer_in(width_key, 1, 1 << 20);
  m.moe.renormalize = r.flag("norm_topk_prob", false);
  m.moe.aux_loss_coef = r.number("router_aux_loss_coef", m.moe.aux_loss_coef);
}

void write_moe(const ModelConfig& m, nlohmann::json& j, const std::string& experts_key, const std::string& width_key) {
  j[experts_key] = m.moe.num_experts;
  j["num_experts_per_tok"] = m.moe.top_k;
  j[width_key] = m.moe.expert_hidden;
  j["norm_topk_prob"] = m.moe.renormalize;
  j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
}

void check_moe_exportable(const ModelConfig& m, const std::string& arch) {
  auto refuse = [&](const std::string& what) {
    throw ConfigError(fmt::format("export to {}: {} has no Hugging Face equivalent", arch, what));
  };
  if (m.moe.router != RouterKind::SoftmaxTopK) refuse("model.moe.router = " + to_string(m.moe.router));
  if (m.moe.activation != Activation::SwiGLU) refuse("model.moe.activation = " + to_string(m.moe.activation));
  if (m.moe.expert_bias) refuse("model.moe.expert_bias = true");
  if (m.moe.gate_scale > 0) refuse("model.moe.gate_scale (a learnable gate scale)");
  if (m.moe.bias_update > 0) refuse("model.moe.bias_update (the aux-loss-free selection bias)");
  if (m.moe.capacity_factor > 0) refuse("model.moe.capacity_factor (token dropping)");
  if (m.moe.dense_ffn != "swiglu") refuse("model.moe.dense_ffn = " + m.moe.dense_ffn);
}

}  // namespace mf::hf
