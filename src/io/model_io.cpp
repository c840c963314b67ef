#include "io/model_io.h"

#include "io/hf/hf_dir.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/bf16.h"
#include "core/init.h"
#include "core/runtime.h"
#include "core/util.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/weight_source.h"
#include "model/weight_dtype.h"

namespace mf {

NamedTensors model_tensors(const torch::nn::Module& model) {
  NamedTensors out;
  for (auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value());
  for (auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value());  // e.g. router selection bias
  return out;
}

void load_model_tensors(torch::nn::Module& model, const SafetensorsData& st) {
  torch::NoGradGuard g;
  auto params = model.named_parameters();
  for (auto& p : params) {
    const auto& t = st.at(p.key());
    if (t.sizes() != p.value().sizes())
      throw FormatError(fmt::format("tensor '{}' has shape {} in the checkpoint but {} in the model", p.key(),
                                    c10::str(t.sizes()), c10::str(p.value().sizes())));
    require_dtype("checkpoint", p.key(), t.scalar_type(), p.value().scalar_type());
    p.value().copy_(t);
  }
  auto buffers = model.named_buffers();
  for (auto& b : buffers) {
    const auto& t = st.at(b.key());
    if (t.sizes() != b.value().sizes()) throw FormatError(fmt::format("buffer '{}' has the wrong shape", b.key()));
    require_dtype("checkpoint", b.key(), t.scalar_type(), b.value().scalar_type());
    b.value().copy_(t);
  }
  for (auto& [name, t] : st.tensors)
    if (!params.contains(name) && !buffers.contains(name))
      throw FormatError(fmt::format("checkpoint has unexpected tensor '{}'", name));
}

void load_module_tensors(torch::nn::Module& module, const SafetensorsShards& file, const std::string& prefix) {
  torch::NoGradGuard g;
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  for (auto* set : {&params, &buffers})
    for (auto& p : *set) {
      const auto name = prefix + p.key();
      if (!held_narrow(p.value().scalar_type())) {
        file.read_into(name, p.value());
        continue;
      }
      const auto stored = file.read(name);
      if (stored.sizes() != p.value().sizes())
        throw FormatError(fmt::format("tensor '{}' has shape {} in the checkpoint but {} in the model", name,
                                      c10::str(stored.sizes()), c10::str(p.value().sizes())));
      copy_weights(p.value(), stored);
    }
  for (auto& name : file.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto local = name.substr(prefix.size());
    if (!params.contains(local) && !buffers.contains(local))
      throw FormatError(fmt::format("checkpoint has unexpected tensor '{}'", name));
  }
}

Config checkpoint_config(const std::string& ckpt_path) {
  if (hf::is_hf_dir(ckpt_path)) return hf::HfDir(ckpt_path).config();
  const auto dir = checkpoint_dir(ckpt_path);  // the header only: a model larger than memory is fine
  const auto metadata = SafetensorsShards(dir, "model").metadata();
  Config cfg;
  apply_toml_text(cfg, config_toml_of(metadata, dir), dir + "/model.safetensors [moeforge.config]");
  auto it = metadata.find("moeforge.vocab_size");
  if (it == metadata.end()) throw FormatError(dir + "/model.safetensors lacks the moeforge.vocab_size metadata");
  try {
    cfg.model.vocab_size = parse_int(it->second, "moeforge.vocab_size");
  } catch (const std::invalid_argument& e) {
    throw FormatError(fmt::format("{}/model.safetensors: {}", dir, e.what()));
  }
  try {  // the same checks and messages as a user's config, naming the file it came from
    validate(cfg);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}/model.safetensors [moeforge.config]: {}", dir, e.what()));
  }
  return cfg;
}

// The checkpoint's config, which must be of `task` (the commands that take one task say so).
static Config checkpoint_config_of(const std::string& path, const std::string& task) {
  auto cfg = checkpoint_config(path);
  if (cfg.model.task != task)
    throw std::runtime_error(
        fmt::format("'{}' holds a model.task = \"{}\" model; this command needs \"{}\" "
                    "(eval, info, usage and probe take both)",
                    path, cfg.model.task, task));
  return cfg;
}

LoadedModel load_model_or_shape(const std::string& source, at::ScalarType weights) {
  if (source.size() <= 5 || source.substr(source.size() - 5) != ".toml") return load_model(source, weights);
  LoadedModel l;
  l.cfg = load_config(source);
  l.cfg.model.vocab_size = l.cfg.data.vocab_size;
  l.tokenizer = tokenizer_in(l.cfg.data.dir);
  l.model = TransformerLM(l.cfg.model);
  l.model->init_weights(static_cast<uint64_t>(l.cfg.train.seed));
  hold_weights(*l.model, weights);
  return l;
}

namespace {
// The model uninitialised (every tensor is loaded next): seconds saved per billion parameters.
TransformerLM shaped_model(const ModelConfig& c, at::ScalarType weights) {
  const ShapesOnly shapes;
  TransformerLM model(c);
  const auto held = hold_weights(*model, weights, /*values=*/false);
  if (held.tensors > 0)
    spdlog::info(
        "weights: {:.2f} B parameters held in {}, {:.2f} M kept in float32 (norms, biases, routers, method "
        "tensors{})",
        static_cast<double>(held.parameters) * 1e-9, weight_dtype_name(weights), static_cast<double>(held.kept) * 1e-6,
        weights == at::kChar ? ", matrices whose rows are not whole blocks of 32" : "");
  return model;
}
}  // namespace

LoadedModel load_model(const std::string& path, at::ScalarType weights) {
  const StreamingAllocatorScope streaming;
  LoadedModel l;
  l.cfg = checkpoint_config_of(path, "lm");
  if (hf::is_hf_dir(path)) {  // a Hugging Face directory, converted in memory as `import` does
    const hf::HfDir hf(path);
    l.model = shaped_model(l.cfg.model, weights);
    std::vector<std::string> used;
    torch::NoGradGuard g;
    for (auto& [name, t] : model_tensors(*l.model))
      copy_weights(t, hf.ours(name, t.sizes(), used, t.scalar_type() == at::kBFloat16));
    hf.check_all_read(used);
    l.tokenizer = model_tokenizer(path);
    return l;
  }
  const auto dir = checkpoint_dir(path);
  l.model = shaped_model(l.cfg.model, weights);
  load_module_tensors(*l.model, SafetensorsShards(dir, "model"), "");  // streamed: one copy in memory
  l.tokenizer = model_tokenizer(dir);
  return l;
}

Metadata step0_metadata(const Config& cfg, const std::string& architecture) {
  return {{"moeforge.config", to_toml(cfg)},
          {"moeforge.step", "0"},
          {"moeforge.vocab_size", std::to_string(cfg.model.vocab_size)},
          {"moeforge.architecture", architecture}};
}

SafetensorsData model_weights(const std::string& path) {
  const auto src = open_weights(path);
  SafetensorsData d{{}, src.metadata};
  for (auto& spec : src.specs) d.tensors[spec.name] = src.read(spec);
  return d;
}

std::string model_tokenizer(const std::string& path) {
  return hf::is_hf_dir(path) ? tokenizer_in(path) : Checkpoint{checkpoint_dir(path), {}}.tokenizer_path();
}

LoadedClassifier load_classifier(const std::string& path) {
  LoadedClassifier l;
  l.cfg = checkpoint_config_of(path, "classify");
  l.model = VisionTransformer(l.cfg.model);
  load_module_tensors(*l.model, SafetensorsShards(checkpoint_dir(path), "model"), "");
  return l;
}

}  // namespace mf
