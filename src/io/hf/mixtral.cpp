// Mixtral (model_type "mixtral"): every block sparse ("block_sparse_moe", experts w1 = gate,
// w3 = up, w2 = down), softmax over all experts, top-k, always renormalised; no attention biases.
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read_mixtral(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m, {1e6, 1e-5});  // transformers' mixtral defaults
  r.require("attention_bias", false, "Mixtral attention has no biases");
  read_moe(r, m, "num_local_experts", "intermediate_size");
  m.moe.layers = "all";
  m.moe.renormalize = true;  // always, whatever norm_topk_prob says
}

void write_mixtral(const ModelConfig& m, nlohmann::json& j) {
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
  write_moe(m, j, "num_local_experts", "intermediate_size");
  j.erase("norm_topk_prob");
  j["sliding_window"] = nullptr;
}

}  // namespace

const Arch& mixtral_arch() {
  static const Arch a{"mixtral", "MixtralForCausalLM", "block_sparse_moe", "w1", "w3", "w2",
                      true,      read_mixtral,         write_mixtral};
  return a;
}

}  // namespace mf::hf
