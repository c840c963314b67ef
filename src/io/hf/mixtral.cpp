// Mixtral (model_type "mixtral"): every block sparse ("block_sparse_moe", experts w1 = gate,
// w3 = up, w2 = down), softmax over all experts, top-k, always renormalised; no attention biases.
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m);
  r.require("attention_bias", false, "Mixtral attention has no biases");
  m.ffn = "moe";
  m.moe.layers = "all";
  m.moe.num_experts = r.integer("num_local_experts");
  m.moe.top_k = r.integer("num_experts_per_tok");
  m.moe.expert_hidden = r.integer("intermediate_size");
  m.moe.renormalize = true;
  m.moe.aux_loss_coef = r.number("router_aux_loss_coef", m.moe.aux_loss_coef);
}

void write(const ModelConfig& m, nlohmann::json& j) {
  check_moe_exportable(m, "mixtral");
  if (num_moe_layers(m) != m.n_layers)
    throw ConfigError("export to mixtral: every block must be MoE (model.moe.layers)");
  if (!m.moe.renormalize)
    throw ConfigError("export to mixtral: Mixtral renormalises the top-k weights (model.moe.renormalize)");
  if (m.moe.n_shared > 0 || m.moe.shared_hidden > 0)
    throw ConfigError("export to mixtral: Mixtral has no shared expert");
  if (m.qk_norm != "none" || m.qkv_bias || m.o_bias)
    throw ConfigError("export to mixtral: Mixtral attention has no q/k norm and no biases");
  write_common(m, j);
  j["intermediate_size"] = m.moe.expert_hidden;
  j["num_local_experts"] = m.moe.num_experts;
  j["num_experts_per_tok"] = m.moe.top_k;
  j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
  j["sliding_window"] = nullptr;
}

}  // namespace

const Arch& mixtral_arch() {
  static const Arch a{"mixtral", "MixtralForCausalLM", "block_sparse_moe", "w1", "w3", "w2", true, read, write};
  return a;
}

}  // namespace mf::hf
