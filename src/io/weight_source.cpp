#include "io/weight_source.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>

#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"
#include "io/safetensors_shards.h"

namespace mf {

WeightSource open_weights(const std::string& path) {
  WeightSource s;
  if (hf::is_hf_dir(path)) {
    auto dir = std::make_shared<hf::HfDir>(path);
    s.dir = path;
    s.hf_type = dir->arch().model_type;
    s.config = dir->config();
    s.metadata = step0_metadata(s.config, s.hf_type);
    s.specs = hf::model_specs(s.config.model);
    s.stored = dir->entry("model.embed_tokens.weight").dtype;
    s.read = [dir](const TensorSpec& spec) {
      std::vector<std::string> used;
      return dir->ours(spec.name, spec.shape, used).to(spec.dtype);
    };
    s.tokenizer = tokenizer_in(path);
    for (auto& f : std::filesystem::directory_iterator(path))
      if (f.path().extension() == ".safetensors") s.bytes += static_cast<int64_t>(f.file_size());
    return s;
  }
  s.dir = checkpoint_dir(path);
  s.config = checkpoint_config(path);
  auto shards = std::make_shared<SafetensorsShards>(s.dir, "model");
  s.metadata = shards->metadata();
  for (auto& name : shards->names()) s.specs.push_back({name, shards->entry(name).dtype, shards->entry(name).shape});
  s.read = [shards](const TensorSpec& spec) { return shards->read(spec.name); };
  s.tokenizer = tokenizer_in(s.dir);
  s.bytes = shards->bytes();
  return s;
}

std::string write_like_source(const WeightSource& src, const CheckpointContents& contents, const std::string& out,
                              const std::string& arch) {
  if (src.hf_type.empty()) {
    write_checkpoint(out, contents);
    return "";
  }
  const auto checkpoint = out + ".checkpoint-tmp";
  write_checkpoint(checkpoint, contents);
  hf::ExportOptions e;
  e.arch = arch;
  e.dtype = src.stored;
  try {
    const auto written = hf::export_hf(checkpoint, out, e).arch;
    std::filesystem::remove_all(checkpoint);
    return written;
  } catch (...) {
    std::filesystem::remove_all(checkpoint);
    throw;
  }
}

void load_module(torch::nn::Module& module, const WeightSource& src, const std::string& prefix) {
  torch::NoGradGuard g;
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  for (auto* set : {&params, &buffers})
    for (auto& p : *set) {
      const TensorSpec spec{prefix + p.key(), p.value().scalar_type(), p.value().sizes().vec()};
      const auto t = src.read(spec);
      if (t.sizes() != p.value().sizes())
        throw FormatError(fmt::format("{}: tensor '{}' has shape {}; the model expects {}", src.dir, spec.name,
                                      c10::str(t.sizes()), c10::str(p.value().sizes())));
      p.value().copy_(t);
    }
  for (auto& spec : src.specs) {
    if (spec.name.rfind(prefix, 0) != 0) continue;
    const auto local = spec.name.substr(prefix.size());
    if (!params.contains(local) && !buffers.contains(local))
      throw FormatError(fmt::format("{}: unexpected tensor '{}'", src.dir, spec.name));
  }
}

}  // namespace mf
