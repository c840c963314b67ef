// Qwen2-MoE (model_type "qwen2_moe"): biases on q, k, v (not o); a shared SwiGLU expert of its
// own width whose output is scaled by sigmoid(shared_expert_gate x); norm_topk_prob;
// decoder_sparse_step and mlp_only_layers choose the sparse blocks (the others: a dense MLP of
// intermediate_size).
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read_qwen2_moe(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m);
  read_moe(r, m, "num_experts", "moe_intermediate_size");
  m.moe.shared_hidden = r.integer_in("shared_expert_intermediate_size", 0, 1 << 20);
  if (m.moe.shared_hidden < 1) r.fail("shared_expert_intermediate_size", "must be positive");
  m.moe.shared_gate = true;
  m.qkv_bias = r.flag("qkv_bias", true);
  m.o_bias = false;
  read_sparse_layers(r, m);
}

void write_qwen2_moe(const ModelConfig& m, nlohmann::json& j) {
  check_moe_exportable(m, "qwen2_moe");
  if (!m.moe.shared_gate || (m.moe.shared_hidden == 0 && m.moe.n_shared == 0))
    throw ConfigError("export to qwen2_moe: Qwen2-MoE needs a gated shared expert (model.moe.shared_gate)");
  if (m.qk_norm != "none" || m.o_bias || !m.qkv_bias)
    throw ConfigError("export to qwen2_moe: Qwen2-MoE attention has q/k/v biases, no o bias and no q/k norm");
  write_common(m, j);
  write_moe(m, j, "num_experts", "moe_intermediate_size");
  j["shared_expert_intermediate_size"] =
      m.moe.shared_hidden > 0 ? m.moe.shared_hidden : m.moe.n_shared * m.moe.expert_hidden;
  j["qkv_bias"] = true;
  j["use_sliding_window"] = false;
  write_sparse_layers(m, j);
}

}  // namespace

const Arch& qwen2_moe_arch() {
  static const Arch a{"qwen2_moe", "Qwen2MoeForCausalLM", "mlp",          "gate_proj", "up_proj", "down_proj",
                      true,        read_qwen2_moe,        write_qwen2_moe};
  return a;
}

}  // namespace mf::hf
