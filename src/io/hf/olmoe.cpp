// OLMoE (model_type "olmoe"): RMSNorm over the whole q projection (width hidden_size) and the
// whole k projection (kv heads x head width) before the head split and RoPE; attention_bias on
// q, k, v and o; every block sparse with experts of intermediate_size; norm_topk_prob (false in
// the released models); clip_qkv unsupported.
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read_olmoe(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m, {10000.0, 1e-5});  // transformers' olmoe defaults
  r.require("clip_qkv", nullptr, "clamping q, k and v");
  if (m.head_dim != 0) r.fail("head_dim", "must equal hidden_size / num_attention_heads for OLMoE");
  read_moe(r, m, "num_experts", "intermediate_size");
  m.moe.layers = "all";
  m.qk_norm = "full";
  m.qkv_bias = m.o_bias = r.flag("attention_bias", false);
}

void write_olmoe(const ModelConfig& m, nlohmann::json& j) {
  check_moe_exportable(m, "olmoe");
  if (m.qk_norm != "full")
    throw ConfigError("export to olmoe: OLMoE normalises the whole q and k (model.qk_norm = full)");
  if (m.head_dim != 0)
    throw ConfigError("export to olmoe: OLMoE's head width is hidden_size / heads (model.head_dim = 0)");
  if (num_moe_layers(m) != m.n_layers) throw ConfigError("export to olmoe: every block must be MoE (model.moe.layers)");
  if (m.qkv_bias != m.o_bias) throw ConfigError("export to olmoe: attention_bias covers q, k, v and o together");
  if (m.moe.n_shared > 0 || m.moe.shared_hidden > 0) throw ConfigError("export to olmoe: OLMoE has no shared expert");
  write_common(m, j);
  j.erase("head_dim");
  j["attention_bias"] = m.qkv_bias;
  write_moe(m, j, "num_experts", "intermediate_size");
  j["clip_qkv"] = nullptr;
}

}  // namespace

const Arch& olmoe_arch() {
  static const Arch a{"olmoe", "OlmoeForCausalLM", "mlp",      "gate_proj", "up_proj", "down_proj",
                      true,    read_olmoe,         write_olmoe};
  return a;
}

}  // namespace mf::hf
