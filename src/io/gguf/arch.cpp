#include "io/gguf/arch.h"

#include <fmt/format.h>

#include <map>
#include <regex>

namespace mf::gguf {
namespace {

const std::map<std::string, Arch>& llama_cpp_archs() {
  // HF model_type -> {name, interleaved_rope, renormalizes, needs_output, dense_allowed}
  static const std::map<std::string, Arch> archs = {
      {"llama", {"llama", true, true, false, true}},          {"mixtral", {"llama", true, true, false, false}},
      {"qwen2_moe", {"qwen2moe", false, false, true, false}}, {"qwen3_moe", {"qwen3moe", false, true, false, false}},
      {"olmoe", {"olmoe", false, false, true, false}},
  };
  return archs;
}

void check_llama_cpp_fit(const Arch& a, const ModelConfig& m) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError(fmt::format("export --format gguf ({}): {}", a.name, why));
  };
  const bool moe = m.ffn == "moe";
  if (moe && num_moe_layers(m) != m.n_layers)
    refuse("llama.cpp builds every block of a MoE model as MoE; model.moe.layers = " + m.moe.layers +
           " leaves some dense");
  if (!moe && !a.dense_allowed) refuse("llama.cpp's " + a.name + " needs MoE blocks");
  if (moe && m.moe.renormalize != a.renormalizes)
    refuse(fmt::format("llama.cpp's {} {} the top-k weights; model.moe.renormalize = {}", a.name,
                       a.renormalizes ? "always renormalises" : "never renormalises", m.moe.renormalize));
  const bool shared = m.moe.n_shared > 0 || m.moe.shared_hidden > 0;
  if (a.name == "qwen2moe" && (!shared || !m.moe.shared_gate))
    refuse("llama.cpp's qwen2moe needs a gated shared expert (model.moe.shared_hidden, model.moe.shared_gate)");
  if (a.name != "qwen2moe" && shared) refuse("llama.cpp's " + a.name + " has no shared expert");
  if (m.o_bias && a.name != "llama") refuse("llama.cpp's " + a.name + " has no output-projection bias");
  if ((a.name == "qwen2moe" || a.name == "olmoe") && m.head_width() * m.n_heads != m.d_model)
    refuse("llama.cpp's " + a.name + " needs head_dim x heads = hidden size");
  if (a.name == "olmoe" && m.n_kv_heads != m.n_heads)
    refuse("llama.cpp's olmoe normalises k over the hidden size: model.n_kv_heads must equal model.n_heads");
}

// HF's rotate-half RoPE pairs row i with row i + d/2 of each head; llama.cpp's normal RoPE
// pairs rows 2i and 2i + 1: row 2i + j of a head takes row j * d/2 + i.
at::Tensor interleave_heads(const at::Tensor& t, int64_t heads) {
  const auto rows = t.size(0), half = rows / heads / 2;
  auto shape = t.sizes().vec();
  std::vector<int64_t> split = {heads, 2, half};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return t.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

}  // namespace

const Arch& arch_for(const std::string& hf_type, const ModelConfig& m) {
  const auto& archs = llama_cpp_archs();
  const auto it = archs.find(hf_type);
  if (it == archs.end())
    throw ConfigError(fmt::format("export --format gguf: no llama.cpp architecture for '{}'", hf_type));
  check_llama_cpp_fit(it->second, m);
  return it->second;
}

void write_hparams(Writer& w, const Arch& a, const ModelConfig& m) {
  const auto key = [&](const char* k) { return a.name + "." + k; };
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.set(key("context_length"), u32(m.max_seq_len));
  w.set(key("embedding_length"), u32(m.d_model));
  w.set(key("block_count"), u32(m.n_layers));
  w.set(key("vocab_size"), u32(m.vocab_size));
  w.set(key("attention.head_count"), u32(m.n_heads));
  w.set(key("attention.head_count_kv"), u32(m.n_kv_heads));
  w.set(key("attention.key_length"), u32(m.head_width()));
  w.set(key("attention.value_length"), u32(m.head_width()));
  w.set(key("attention.layer_norm_rms_epsilon"), static_cast<float>(m.norm_eps));
  w.set(key("rope.freq_base"), static_cast<float>(m.rope_theta));
  w.set(key("rope.dimension_count"), u32(m.head_width()));
  if (m.ffn != "moe") {
    w.set(key("feed_forward_length"), u32(m.ffn_hidden));
    return;
  }
  w.set(key("expert_count"), u32(m.moe.num_experts));
  w.set(key("expert_used_count"), u32(m.moe.top_k));
  // llama: the experts' width is feed_forward_length; the others read expert_feed_forward_length
  w.set(key("feed_forward_length"), u32(a.name == "llama" ? m.moe.expert_hidden : m.ffn_hidden));
  if (a.name != "llama") w.set(key("expert_feed_forward_length"), u32(m.moe.expert_hidden));
  if (a.name == "qwen2moe")
    w.set(key("expert_shared_feed_forward_length"),
          u32(m.moe.shared_hidden > 0 ? m.moe.shared_hidden : m.moe.n_shared * m.moe.expert_hidden));
}

namespace {

using GgufTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Our block tensor `name`, `rest` after its "model.layers.<i>.", as GGUF's under "blk.<i>." (`blk`).
GgufTensors block_tensors(const Arch& a, const ModelConfig& m, const std::string& name, const std::string& blk,
                          const std::string& rest, const at::Tensor& t) {
  static const std::map<std::string, std::string> same = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},       {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.experts.down_proj", "ffn_down_exps.weight"}, {"mlp.shared_experts.down_proj", "ffn_down_shexp.weight"},
  };
  if (auto it = same.find(rest); it != same.end())
    return {{blk + it->second, rest == "mlp.shared_experts.down_proj" ? t[0] : t}};
  static const std::regex qk_re(R"(^self_attn\.(q|k)_proj\.(weight|bias)$)");
  if (std::smatch qk; std::regex_match(rest, qk, qk_re)) {
    const auto out = fmt::format("{}attn_{}.{}", blk, qk[1].str(), qk[2].str());
    const int64_t heads = qk[1] == "q" ? m.n_heads : m.n_kv_heads;
    return {{out, a.interleaved_rope ? interleave_heads(t, heads) : t}};
  }
  if (rest == "mlp.experts.gate_up_proj" || rest == "mlp.shared_experts.gate_up_proj") {
    const bool shared = rest == "mlp.shared_experts.gate_up_proj";
    const auto w = shared ? t[0] : t;
    const auto f = w.size(-2) / 2;
    const auto suffix = shared ? "shexp" : "exps";
    return {{fmt::format("{}ffn_gate_{}.weight", blk, suffix), w.narrow(-2, 0, f).contiguous()},
            {fmt::format("{}ffn_up_{}.weight", blk, suffix), w.narrow(-2, f, f).contiguous()}};
  }
  if (rest == "mlp.shared_gate.weight") return {{blk + "ffn_gate_inp_shexp.weight", t.reshape({-1})}};
  if (rest == "mlp.gate.selection_bias") {
    if (t.abs().max().item<double>() != 0)
      throw ConfigError(
          fmt::format("export --format gguf: '{}' is non-zero; llama.cpp's {} has no selection bias", name, a.name));
    return {};
  }
  throw ConfigError(fmt::format(
      "export --format gguf: tensor '{}' has no place in llama.cpp's {} (a method's own tensor?)", name, a.name));
}

}  // namespace

GgufTensors gguf_tensors(const Arch& a, const ModelConfig& m, const std::string& name, const at::Tensor& t) {
  if (name == "model.embed_tokens.weight") {
    if (a.needs_output && m.tie_embeddings) return {{"token_embd.weight", t}, {"output.weight", t}};
    return {{"token_embd.weight", t}};
  }
  if (name == "model.norm.weight") return {{"output_norm.weight", t}};
  if (name == "lm_head.weight") return {{"output.weight", t}};
  static const std::regex layer_re(R"(^model\.layers\.(\d+)\.(.+)$)");
  std::smatch match;
  if (!std::regex_match(name, match, layer_re))
    throw ConfigError(fmt::format("export --format gguf: tensor '{}' has no place in llama.cpp's {}", name, a.name));
  return block_tensors(a, m, name, "blk." + match[1].str() + ".", match[2].str(), t);
}

Type storage(const std::string& gguf_name, at::IntArrayRef shape, Type dtype) {
  if (shape.size() < 2 || gguf_name.find("ffn_gate_inp") != std::string::npos) return Type::F32;
  if (dtype == Type::Q8_0 && shape.back() % kQ8Block != 0) return Type::F16;
  return dtype;
}

}  // namespace mf::gguf
