// LLaMA (model_type "llama"): the dense decoder; attention_bias puts biases on q, k, v and o.
#include "io/hf/arch.h"

namespace mf::hf {
namespace {

void read_llama(const ConfigReader& r, ModelConfig& m) {
  read_common(r, m);
  m.ffn = "swiglu";
  m.qkv_bias = m.o_bias = r.flag("attention_bias", false);
}

void write_llama(const ModelConfig& m, nlohmann::json& j) {
  if (m.ffn != "swiglu") throw ConfigError("export to llama: the model's FFNs are not dense SwiGLU (model.ffn)");
  if (m.qk_norm != "none") throw ConfigError("export to llama: LLaMA has no q/k norm (model.qk_norm)");
  if (m.qkv_bias != m.o_bias) throw ConfigError("export to llama: attention_bias covers q, k, v and o together");
  write_common(m, j);
  j["attention_bias"] = m.qkv_bias;
}

}  // namespace

const Arch& llama_arch() {
  static const Arch a{"llama", "LlamaForCausalLM", "mlp",      "gate_proj", "up_proj", "down_proj",
                      false,   read_llama,         write_llama};
  return a;
}

}  // namespace mf::hf
