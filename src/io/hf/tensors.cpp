#include "io/hf/tensors.h"

#include <fmt/format.h>

#include <cstring>
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

// One rule per tensor of a MoE slot: our name after "model.layers.{i}.mlp." and the Hugging Face
// tensors (after "model.layers.{i}.") whose rows it joins. Import concatenates them along dim 0;
// export, the inverse, splits ours into as many equal row blocks. {moe}, {gate}, {up}, {down}
// are the architecture's names (Arch), {e} the expert.
enum class Stack { One, PerExpert, Shared };  // [..]; [E, ..] one per expert; [1, ..] the shared expert
struct Rule {
  std::string ours;
  std::vector<std::string> hf;  // none: a buffer HF does not have (must be zero to export)
  Stack stack = Stack::One;
};

const std::vector<Rule>& moe_rules() {
  static const std::vector<Rule> rules = {
      {"gate.weight", {"{moe}.gate.weight"}},
      {"gate.selection_bias", {}},
      {"experts.gate_up_proj", {"{moe}.experts.{e}.{gate}.weight", "{moe}.experts.{e}.{up}.weight"}, Stack::PerExpert},
      {"experts.down_proj", {"{moe}.experts.{e}.{down}.weight"}, Stack::PerExpert},
      {"shared_experts.gate_up_proj",
       {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"},
       Stack::Shared},
      {"shared_experts.down_proj", {"mlp.shared_expert.down_proj.weight"}, Stack::Shared},
      {"shared_gate.weight", {"mlp.shared_expert_gate.weight"}},
  };
  return rules;
}

const Rule* rule_for(const std::string& rest) {
  for (auto& r : moe_rules())
    if (r.ours == rest) return &r;
  return nullptr;
}

std::string hf_name(const Arch& a, const std::string& prefix, std::string pattern, int64_t e) {
  const std::pair<const char*, std::string> fields[] = {{"{moe}", a.moe_module},
                                                        {"{gate}", a.w_gate},
                                                        {"{up}", a.w_up},
                                                        {"{down}", a.w_down},
                                                        {"{e}", std::to_string(e)}};
  for (auto& [key, value] : fields)
    for (size_t at = pattern.find(key); at != std::string::npos; at = pattern.find(key))
      pattern.replace(at, std::strlen(key), value);
  return prefix + pattern;
}

}  // namespace

at::Tensor import_tensor(const Arch& a, const std::string& name, at::IntArrayRef shape, const ReadHf& read,
                         std::vector<std::string>& used) {
  at::Tensor t;
  const auto [prefix, rest] = split_mlp(name);
  if (const Rule* r = rule_for(rest)) {
    const auto joined = [&](int64_t e) {
      std::vector<at::Tensor> parts;
      for (auto& pattern : r->hf) {
        used.push_back(hf_name(a, prefix, pattern, e));
        parts.push_back(read(used.back()));
        if (parts.back().dim() == 0)
          throw FormatError(fmt::format("import: '{}' is a scalar; '{}' needs a matrix", used.back(), name));
        if (parts.back().dim() != parts.front().dim() ||
            parts.back().sizes().slice(1) != parts.front().sizes().slice(1))
          throw FormatError(fmt::format("import: '{}' has shape {}, which cannot join {} of shape {} into '{}'",
                                        used.back(), c10::str(parts.back().sizes()), used[used.size() - 2],
                                        c10::str(parts.front().sizes()), name));
      }
      return at::cat(parts);
    };
    if (r->hf.empty()) {
      t = at::zeros(shape, at::kFloat);
    } else if (r->stack == Stack::PerExpert) {  // filled expert by expert: one copy of the bank in memory
      for (int64_t e = 0; e < shape[0]; ++e) {
        const auto expert = joined(e);
        if (expert.sizes() != shape.slice(1))
          throw FormatError(
              fmt::format("import: expert {} of '{}' has shape {} from the Hugging Face tensors; the model expects {}",
                          e, name, c10::str(expert.sizes()), c10::str(shape.slice(1))));
        if (e == 0) t = at::empty(shape, expert.options());
        t[e].copy_(expert);
      }
    } else {
      t = r->stack == Stack::Shared ? joined(0).unsqueeze(0) : joined(0);
    }
  } else if (kept_name(name)) {
    used.push_back(name);
    t = read(name);
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
  const Rule* r = rule_for(rest);
  if (!r) {
    if (kept_name(name)) return {{name, t}};
    throw ConfigError(fmt::format(
        "export: tensor '{}' has no Hugging Face equivalent (a method's own tensor: only the engine's MoE, dense "
        "SwiGLU and attention tensors export; see src/io/hf/README.md)",
        name));
  }
  if (r->hf.empty()) {
    if (t.abs().max().item<double>() != 0)
      throw ConfigError(fmt::format(
          "export: '{}' is non-zero (aux-loss-free balancing); Hugging Face routers have no selection bias", name));
    return {};
  }
  NamedTensors out;
  const auto split = [&](const at::Tensor& w, int64_t e) {
    const auto n = static_cast<int64_t>(r->hf.size()), rows = w.size(0) / n;
    for (int64_t i = 0; i < n; ++i) out.emplace_back(hf_name(a, prefix, r->hf[i], e), w.narrow(0, i * rows, rows));
  };
  if (r->stack == Stack::PerExpert)
    for (int64_t e = 0; e < t.size(0); ++e) split(t[e], e);
  else
    split(r->stack == Stack::Shared ? t[0] : t, 0);
  return out;
}

bool ignorable_hf_tensor(const std::string& hf_name, bool tied) {
  static const std::regex rotary(R"(.*rotary_emb\.inv_freq$)");
  return std::regex_match(hf_name, rotary) || (tied && hf_name == "lm_head.weight");
}

}  // namespace mf::hf
