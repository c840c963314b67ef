#include "io/upcycle.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "core/init.h"
#include "core/param_roles.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "model/params.h"

namespace mf {
namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// The upcycled model without values (ShapesOnly): its parameters' and buffers' names, shapes and roles.
std::shared_ptr<torch::nn::Module> shaped_upcycled(const ModelConfig& c) {
  const ShapesOnly shapes;
  if (c.task == "classify") return VisionTransformer(c).ptr();
  return TransformerLM(c).ptr();
}

// Expert tensor `local` of an upcycled block made of its dense FFN tensors (under `mlp`, read by
// `read`): SwiGLU gate_up_proj [2F, D] = gate rows then up rows, down_proj [D, F]; GELU fc1 / fc2
// and their biases.
at::Tensor dense_as_expert(const std::function<at::Tensor(const std::string&)>& read, const std::string& mlp,
                           const std::string& local, bool gelu) {
  static const std::map<std::string, std::string> gelu_parts = {{"gate_up_proj", "fc1.weight"},
                                                                {"down_proj", "fc2.weight"},
                                                                {"gate_up_proj_bias", "fc1.bias"},
                                                                {"down_proj_bias", "fc2.bias"}};
  if (gelu) return read(mlp + gelu_parts.at(local));
  if (local == "gate_up_proj") return at::cat({read(mlp + "gate_proj.weight"), read(mlp + "up_proj.weight")});
  return read(mlp + "down_proj.weight");
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

namespace {

// The upcycled model written tensor by tensor in named_parameters() order, then its buffers: every
// parameter first gets init_by_role's draw (the generator replayed tensor by tensor, seed
// opt.seed), then the dense tensor of the same name, or for an upcycled block's experts E copies
// of its dense FFN (plus noise from a generator seeded opt.seed + 1, expert by expert), routers
// keeping the draw. Peak memory: one tensor (an upcycled block's expert bank).
void write_upcycled(const WeightSource& src, const UpcycleOptions& opt, UpcycleReport& r, const std::string& path,
                    const Metadata& meta) {
  const auto model = shaped_upcycled(r.config.model);
  const auto roles = collect_param_roles(*model);
  const auto params = model->named_parameters(), buffers = model->named_buffers();
  std::vector<TensorSpec> specs;
  for (const auto* set : {&params, &buffers})
    for (const auto& p : *set) specs.push_back({p.key(), at::kFloat, p.value().sizes().vec()});
  std::map<std::string, TensorSpec> stored;
  for (const auto& spec : src.specs) stored.emplace(spec.name, spec);
  const auto read = [&](const std::string& name) {
    auto it = stored.find(name);
    if (it == stored.end()) throw FormatError(fmt::format("the dense checkpoint has no tensor '{}'", name));
    return src.read(it->second).to(at::kFloat);
  };
  const bool gelu = src.config.model.ffn == "gelu";
  const std::string blocks = src.config.model.task == "classify" ? "layers." : "model.layers.";
  std::map<std::string, std::string> banks;  // "<blocks>L.mlp.experts." -> the dense FFN's "<blocks>L.mlp."
  for (auto l : opt.layers) banks[fmt::format("{}{}.mlp.experts.", blocks, l)] = fmt::format("{}{}.mlp.", blocks, l);
  auto init = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  auto noise = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
  SafetensorsWriter w(path, specs, meta);
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    const auto& name = p.key();
    auto t = at::empty(p.value().sizes(), at::kFloat);
    const auto role = roles.at(name);
    if (role == ParamRole::Scale) t.copy_(p.value());  // init_by_role keeps a scale's constructed value
    init_parameter(t, role, init, r.config.model);
    const auto bank = std::find_if(banks.begin(), banks.end(), [&](auto& b) { return name.rfind(b.first, 0) == 0; });
    if (bank != banks.end()) {
      const auto dense = dense_as_expert(read, bank->second, name.substr(bank->first.size()), gelu);
      for (int64_t e = 0; e < t.size(0); ++e) {
        auto copy = dense.clone();
        if (opt.noise > 0 && dense.dim() == 2)
          copy += opt.noise * dense.std().item<double>() * at::empty_like(copy).normal_(0, 1, noise);
        t[e].copy_(copy);
      }
      ++r.converted;
    } else if (name.find(".mlp.gate.") == std::string::npos) {  // routers keep their initialisation
      auto it = stored.find(name);
      if (it == stored.end() || at::IntArrayRef(it->second.shape) != t.sizes())
        throw FormatError(
            fmt::format("upcycle: tensor '{}' of the upcycled model has no counterpart of shape {} in '{}'", name,
                        c10::str(t.sizes()), src.dir));
      t = read(name);
      ++r.copied;
    }
    w.write(t);
  }
  for (const auto& b : buffers) {  // e.g. a selection bias: kept from the dense model when it had one
    auto it = stored.find(b.key());
    const bool kept = it != stored.end() && at::IntArrayRef(it->second.shape) == b.value().sizes();
    w.write(kept ? read(b.key()) : b.value().to(at::kFloat));
  }
  w.finish();
}

}  // namespace

UpcycleReport upcycle(const std::string& in, const std::string& out, const UpcycleOptions& opt) {
  const auto src = open_weights(in);  // a Hugging Face directory's tensors under our names
  UpcycleReport r;
  r.config = upcycled_config(src.config, opt);
  Metadata meta = src.metadata;
  meta["moeforge.config"] = to_toml(r.config);
  meta["moeforge.step"] = "0";
  meta["moeforge.upcycled_from"] = src.dir;
  CheckpointContents contents{{}, {}, meta, {{"step", 0}, {"upcycled_from", src.dir}}, src.tokenizer};
  contents.write_model = [&](const std::string& path) { write_upcycled(src, opt, r, path, meta); };
  // a Hugging Face directory in: the MoE architecture of its family out (Mixtral for LLaMA), in its dtype
  r.hf_arch = write_like_source(src, contents, out, "");
  return r;
}

}  // namespace mf
