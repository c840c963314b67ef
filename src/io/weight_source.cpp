#include "io/weight_source.h"

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
    s.metadata = {{"moeforge.config", to_toml(s.config)},
                  {"moeforge.step", "0"},
                  {"moeforge.vocab_size", std::to_string(s.config.model.vocab_size)},
                  {"moeforge.architecture", s.hf_type}};
    s.specs = hf::model_specs(s.config.model);
    s.read = [dir](const TensorSpec& spec) {
      std::vector<std::string> used;
      return dir->ours(spec.name, spec.shape, used).to(spec.dtype);
    };
    s.tokenizer = tokenizer_in(path);
    return s;
  }
  s.dir = checkpoint_dir(path);
  s.config = checkpoint_config(path);
  auto shards = std::make_shared<SafetensorsShards>(s.dir, "model");
  s.metadata = shards->metadata();
  for (auto& name : shards->names()) s.specs.push_back({name, shards->entry(name).dtype, shards->entry(name).shape});
  s.read = [shards](const TensorSpec& spec) { return shards->read(spec.name); };
  s.tokenizer = tokenizer_in(s.dir);
  return s;
}

}  // namespace mf
