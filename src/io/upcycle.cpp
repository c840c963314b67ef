#include "io/upcycle.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"

namespace mf {
namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// the model of `cfg`'s task, initialised by role from `seed`
std::shared_ptr<torch::nn::Module> build_model(const Config& cfg, uint64_t seed) {
  if (cfg.model.task == "classify") {
    VisionTransformer m(cfg.model);
    m->init_weights(seed);
    return m.ptr();
  }
  TransformerLM m(cfg.model);
  m->init_weights(seed);
  return m.ptr();
}

// The dense FFN tensors of block `layer` as expert tensors: gate_up_proj [F|2F, D], down_proj
// [D, F] and (GELU) their biases, keyed by the expert tensor's local name.
std::map<std::string, at::Tensor> dense_as_expert(const SafetensorsData& st, const std::string& mlp, bool gelu) {
  auto get = [&](const std::string& local) {
    auto it = st.tensors.find(mlp + local);
    if (it == st.tensors.end()) throw FormatError(fmt::format("the dense checkpoint has no tensor '{}{}'", mlp, local));
    return it->second;
  };
  if (gelu)
    return {{"gate_up_proj", get("fc1.weight")},
            {"down_proj", get("fc2.weight")},
            {"gate_up_proj_bias", get("fc1.bias")},
            {"down_proj_bias", get("fc2.bias")}};
  return {{"gate_up_proj", at::cat({get("gate_proj.weight"), get("up_proj.weight")})},
          {"down_proj", get("down_proj.weight")}};
}

std::map<std::string, UpcyclePreset>& presets() {
  static std::map<std::string, UpcyclePreset> p = {
      {"topk",
       [](const UpcycleOptions& o) {
         return std::vector<std::string>{"model.moe.router=softmax_topk", fmt::format("model.moe.top_k={}", o.top_k)};
       }},
      {"topp", [](const UpcycleOptions& o) {
         return std::vector<std::string>{"model.moe.router=top_p", fmt::format("model.moe.top_p={}", o.top_p),
                                         fmt::format("model.moe.top_k={}", std::min<int64_t>(2, o.experts))};
       }}};
  return p;
}

}  // namespace

void register_upcycle_method(const std::string& name, UpcyclePreset preset) { presets()[name] = std::move(preset); }

std::vector<std::string> upcycle_methods() {
  std::vector<std::string> names;
  for (auto& [name, preset] : presets()) names.push_back(name);
  return names;
}

std::vector<int64_t> parse_block_list(const std::string& text, const std::string& option) {
  if (text.empty()) return {};
  try {
    return parse_index_list(text, option);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{} (block numbers like \"1,3\")", e.what()));
  }
}

Config upcycled_config(const Config& dense, const UpcycleOptions& opt) {
  const auto& m = dense.model;
  if (m.ffn != "swiglu" && m.ffn != "gelu")
    throw ConfigError(
        fmt::format("upcycling needs a dense checkpoint (model.ffn = swiglu or gelu); this one has "
                    "model.ffn = \"{}\"",
                    m.ffn));
  if (opt.layers.empty()) throw ConfigError("upcycle: give the blocks to convert (--layers, e.g. 1,3)");
  for (auto l : opt.layers)
    if (l < 0 || l >= m.n_layers)
      throw ConfigError(fmt::format("upcycle: block {} does not exist (model.n_layers = {})", l, m.n_layers));
  const bool gelu = m.ffn == "gelu";
  Config c = dense;
  std::vector<std::string> sets = {"model.ffn=moe",
                                   "model.moe.layers=" + join(opt.layers),
                                   fmt::format("model.moe.dense_ffn={}", m.ffn),
                                   fmt::format("model.moe.activation={}", gelu ? "gelu" : "swiglu"),
                                   fmt::format("model.moe.expert_bias={}", gelu),
                                   fmt::format("model.moe.expert_hidden={}", m.ffn_hidden),
                                   fmt::format("model.moe.num_experts={}", opt.experts),
                                   "model.moe.n_shared=0",
                                   fmt::format("run.name={}-{}", dense.run.name, opt.method)};
  const auto preset = presets().find(opt.method);
  if (preset == presets().end())
    throw ConfigError(
        fmt::format("upcycle --method \"{}\": choose one of {}", opt.method, fmt::join(upcycle_methods(), ", ")));
  const auto own = preset->second(opt);
  sets.insert(sets.end(), own.begin(), own.end());
  sets.insert(sets.end(), opt.sets.begin(), opt.sets.end());
  for (auto& s : sets) apply_override(c, s);
  validate(c);
  return c;
}

UpcycleReport upcycle(const std::string& in, const std::string& out, const UpcycleOptions& opt) {
  const auto weights = model_weights(in);  // a Hugging Face directory's under our names
  const auto from = hf::is_hf_dir(in) ? in : checkpoint_dir(in);
  const Config dense = checkpoint_config(in);
  UpcycleReport r;
  r.config = upcycled_config(dense, opt);
  auto model = build_model(r.config, opt.seed);
  const bool gelu = dense.model.ffn == "gelu";
  const std::string blocks = dense.model.task == "classify" ? "layers." : "model.layers.";
  std::set<std::string> dense_ffn_tensors;
  std::map<std::string, std::map<std::string, at::Tensor>> experts;  // "<blocks>L.mlp.experts." -> local -> tensor
  for (auto l : opt.layers) {
    const auto mlp = fmt::format("{}{}.mlp.", blocks, l);
    experts[mlp + "experts."] = dense_as_expert(weights, mlp, gelu);
    for (auto& [name, t] : weights.tensors)
      if (name.rfind(mlp, 0) == 0) dense_ffn_tensors.insert(name);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    auto& t = p.value();
    const auto& name = p.key();
    bool done = false;
    for (auto& [prefix, parts] : experts) {
      if (name.rfind(prefix, 0) != 0) continue;
      const auto& src = parts.at(name.substr(prefix.size()));
      for (int64_t e = 0; e < t.size(0); ++e) {
        auto copy = src.to(t.dtype()).clone();
        if (opt.noise > 0 && src.dim() == 2)
          copy += opt.noise * src.std().item<double>() * at::empty_like(copy).normal_(0, 1, gen);
        t[e].copy_(copy);
      }
      ++r.converted;
      done = true;
    }
    if (done || name.find(".mlp.gate.") != std::string::npos) continue;  // routers keep their initialisation
    auto it = weights.tensors.find(name);
    if (it == weights.tensors.end() || it->second.sizes() != t.sizes())
      throw FormatError(fmt::format("upcycle: tensor '{}' of the upcycled model has no counterpart of shape {} in '{}'",
                                    name, c10::str(t.sizes()), from));
    t.copy_(it->second);
    ++r.copied;
  }
  for (auto& b : model->named_buffers()) {  // e.g. a selection bias: kept from the dense model when it had one
    auto it = weights.tensors.find(b.key());
    if (it != weights.tensors.end() && it->second.sizes() == b.value().sizes()) b.value().copy_(it->second);
  }
  Metadata meta = weights.metadata;
  meta["moeforge.config"] = to_toml(r.config);
  meta["moeforge.step"] = "0";
  meta["moeforge.upcycled_from"] = from;
  const auto tokenizer = model_tokenizer(in);
  write_checkpoint(out, {model_tensors(*model),
                         {},
                         meta,
                         {{"step", 0}, {"upcycled_from", from}},
                         std::filesystem::exists(tokenizer) ? tokenizer : ""});
  return r;
}

}  // namespace mf
