#include "io/hf/tensors.h"

#include <fmt/format.h>

#include <regex>

namespace mf::hf {
namespace {

// "model.layers.{i}.mlp.{rest}" -> (prefix "model.layers.{i}.", rest); otherwise rest = ""
std::pair<std::string, std::string> split_mlp(const std::string& name) {
  static const std::regex re(R"(^(model\.layers\.\d+\.)mlp\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return {"", ""};
  return {m[1].str(), m[2].str()};
}

bool kept_name(const std::string& name) {
  static const std::regex re(
      R"(^(model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight|model\.layers\.\d+\.((input_layernorm|post_attention_layernorm)\.weight|self_attn\.(q|k|v|o)_proj\.(weight|bias)|self_attn\.(q|k)_norm\.weight|mlp\.(gate|up|down)_proj\.weight))$)");
  return std::regex_match(name, re);
}

std::string expert(const Arch& a, const std::string& prefix, int64_t e, const std::string& w) {
  return fmt::format("{}{}.experts.{}.{}.weight", prefix, a.moe_module, e, w);
}

}  // namespace

at::Tensor import_tensor(const Arch& a, const std::string& name, at::IntArrayRef shape, const ReadHf& read,
                         std::vector<std::string>& used) {
  auto get = [&](const std::string& hf) {
    used.push_back(hf);
    return read(hf);
  };
  at::Tensor t;
  const auto [prefix, rest] = split_mlp(name);
  if (rest == "gate.weight") {
    t = get(prefix + a.moe_module + ".gate.weight");
  } else if (rest == "gate.selection_bias") {
    t = at::zeros(shape, at::kFloat);  // HF routers have no selection bias
  } else if (rest == "experts.gate_up_proj" || rest == "experts.down_proj") {
    std::vector<at::Tensor> per_expert;
    for (int64_t e = 0; e < shape[0]; ++e)
      per_expert.push_back(rest == "experts.down_proj"
                               ? get(expert(a, prefix, e, a.w_down))
                               : at::cat({get(expert(a, prefix, e, a.w_gate)), get(expert(a, prefix, e, a.w_up))}));
    t = at::stack(per_expert);
  } else if (rest == "shared_experts.gate_up_proj") {
    t = at::cat({get(prefix + "mlp.shared_expert.gate_proj.weight"), get(prefix + "mlp.shared_expert.up_proj.weight")})
            .unsqueeze(0);
  } else if (rest == "shared_experts.down_proj") {
    t = get(prefix + "mlp.shared_expert.down_proj.weight").unsqueeze(0);
  } else if (rest == "shared_gate.weight") {
    t = get(prefix + "mlp.shared_expert_gate.weight");
  } else if (kept_name(name)) {
    t = get(name);
  } else {
    throw FormatError(fmt::format("import: the model's tensor '{}' has no Hugging Face source", name));
  }
  if (t.sizes() != shape)
    throw FormatError(fmt::format("import: '{}' built from the Hugging Face tensors has shape {}; the model expects {}",
                                  name, c10::str(t.sizes()), c10::str(shape)));
  return t;
}

NamedTensors export_tensor(const Arch& a, const std::string& name, const at::Tensor& t) {
  const auto [prefix, rest] = split_mlp(name);
  if (rest == "gate.weight") return {{prefix + a.moe_module + ".gate.weight", t}};
  if (rest == "gate.selection_bias") {
    if (t.abs().max().item<double>() != 0)
      throw ConfigError(fmt::format(
          "export: '{}' is non-zero (aux-loss-free balancing); Hugging Face routers have no selection bias", name));
    return {};
  }
  if (rest == "experts.gate_up_proj") {
    NamedTensors out;
    const int64_t F = t.size(1) / 2;
    for (int64_t e = 0; e < t.size(0); ++e) {
      out.emplace_back(expert(a, prefix, e, a.w_gate), t[e].narrow(0, 0, F));
      out.emplace_back(expert(a, prefix, e, a.w_up), t[e].narrow(0, F, F));
    }
    return out;
  }
  if (rest == "experts.down_proj") {
    NamedTensors out;
    for (int64_t e = 0; e < t.size(0); ++e) out.emplace_back(expert(a, prefix, e, a.w_down), t[e]);
    return out;
  }
  if (rest == "shared_experts.gate_up_proj") {
    const int64_t S = t.size(1) / 2;
    return {{prefix + "mlp.shared_expert.gate_proj.weight", t[0].narrow(0, 0, S)},
            {prefix + "mlp.shared_expert.up_proj.weight", t[0].narrow(0, S, S)}};
  }
  if (rest == "shared_experts.down_proj") return {{prefix + "mlp.shared_expert.down_proj.weight", t[0]}};
  if (rest == "shared_gate.weight") return {{prefix + "mlp.shared_expert_gate.weight", t}};
  if (kept_name(name)) return {{name, t}};
  throw ConfigError(fmt::format(
      "export: tensor '{}' has no Hugging Face equivalent (a method's own tensor: only the engine's MoE, dense "
      "SwiGLU and attention tensors export; see src/io/hf/README.md)",
      name));
}

bool ignorable_hf_tensor(const std::string& hf_name, bool tied) {
  static const std::regex rotary(R"(.*rotary_emb\.inv_freq$)");
  return std::regex_match(hf_name, rotary) || (tied && hf_name == "lm_head.weight");
}

}  // namespace mf::hf
