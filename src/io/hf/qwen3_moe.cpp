// Qwen3-MoE (model_type "qwen3_moe"): RMSNorm over each head of q and k (q_norm, k_norm of
// width head_dim, before RoPE), head_dim independent of hidden_size / heads, attention_bias on
// q, k, v and o, norm_topk_prob, decoder_sparse_step and mlp_only_layers; no shared expert.
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read_qwen3_moe(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m);
  read_moe(r, m, "num_experts", "moe_intermediate_size");
  m.qk_norm = "head";
  m.qkv_bias = m.o_bias = r.flag("attention_bias", false);
  read_sparse_layers(r, m);
}

void write_qwen3_moe(const ModelConfig& m, nlohmann::json& j) {
  check_moe_exportable(m, "qwen3_moe");
  if (m.qk_norm != "head")
    throw ConfigError("export to qwen3_moe: Qwen3-MoE normalises each q and k head (model.qk_norm = head)");
  if (m.qkv_bias != m.o_bias) throw ConfigError("export to qwen3_moe: attention_bias covers q, k, v and o together");
  if (m.moe.n_shared > 0 || m.moe.shared_hidden > 0)
    throw ConfigError("export to qwen3_moe: Qwen3-MoE has no shared expert");
  write_common(m, j);
  j["attention_bias"] = m.qkv_bias;
  write_moe(m, j, "num_experts", "moe_intermediate_size");
  j["use_sliding_window"] = false;
  write_sparse_layers(m, j);
}

}  // namespace

const Arch& qwen3_moe_arch() {
  static const Arch a{"qwen3_moe", "Qwen3MoeForCausalLM", "mlp",          "gate_proj", "up_proj", "down_proj",
                      true,        read_qwen3_moe,        write_qwen3_moe};
  return a;
}

}  // namespace mf::hf
