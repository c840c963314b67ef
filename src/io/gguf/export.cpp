#include "io/gguf/export.h"

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <set>

#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/gguf/arch.h"
#include "io/gguf/vocab.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"
#include "io/safetensors_shards.h"

namespace mf::gguf {
namespace fs = std::filesystem;
namespace {

// Our tensors, from a checkpoint or (built one at a time) from a Hugging Face directory.
struct Source {
  ModelConfig model;
  std::string hf_type, tokenizer;
  std::vector<TensorSpec> specs;
  std::function<at::Tensor(const TensorSpec&)> read;  // float32
};

Source open_source(const std::string& path) {
  Source s;
  if (hf::is_hf_dir(path)) {
    auto dir = std::make_shared<hf::HfDir>(path);
    s.model = dir->config().model;
    s.hf_type = dir->arch().model_type;
    s.specs = hf::model_specs(s.model);
    s.read = [dir](const TensorSpec& spec) {
      std::vector<std::string> used;
      return dir->ours(spec.name, spec.shape, used);
    };
    s.tokenizer = tokenizer_in(path);
    return s;
  }
  s.model = checkpoint_config(path).model;
  if (s.model.task != "lm") throw ConfigError("export --format gguf: only language models (model.task = lm)");
  s.hf_type = hf::arch_for(s.model).model_type;
  const auto dir = checkpoint_dir(path);
  auto shards = std::make_shared<SafetensorsShards>(dir, "model");
  s.specs = hf::model_specs(s.model);  // the order a Hugging Face directory gives, so both write the same file
  std::set<std::string> known;
  for (auto& spec : s.specs) known.insert(spec.name);
  for (auto& name : shards->names())
    if (!known.count(name))
      throw ConfigError(
          fmt::format("export --format gguf: tensor '{}' of {} has no place in llama.cpp (a method's "
                      "own tensor?)",
                      name, dir));
  s.read = [shards](const TensorSpec& spec) { return shards->read(spec.name).to(at::kFloat); };
  s.tokenizer = tokenizer_in(dir);
  return s;
}

uint32_t file_type(Type t) { return t == Type::F32 ? 0 : t == Type::F16 ? 1 : 7; }  // llama_ftype ALL_F32, MOSTLY_*

}  // namespace

Type parse_type(const std::string& name) {
  if (name == "f32") return Type::F32;
  if (name == "f16") return Type::F16;
  if (name == "q8_0") return Type::Q8_0;
  throw ConfigError(fmt::format("--dtype {}: GGUF export writes f32, f16 or q8_0", name));
}

ExportReport export_gguf(const std::string& path, const std::string& out, const ExportOptions& opt) {
  auto src = open_source(path);
  const auto hf_type = opt.arch.empty() ? src.hf_type : opt.arch;
  nlohmann::json unused;
  hf::arch_named(hf_type, "--arch").write(src.model, unused);  // what Hugging Face's layout cannot hold
  const Arch& a = arch_for(hf_type, src.model);
  ExportReport r{a.name};

  Writer w;
  w.set("general.architecture", a.name);
  w.set("general.name", fs::path(path).lexically_normal().filename().string());
  w.set("general.file_type", file_type(opt.dtype));
  if (opt.dtype == Type::Q8_0) w.set("general.quantization_version", uint32_t{2});
  write_hparams(w, a, src.model);
  if (!src.tokenizer.empty()) write_vocab(w, src.tokenizer, src.model.vocab_size), r.tokenizer = true;

  // pass 1: names, shapes and types, from shapes alone; pass 2: the bytes, one of our tensors at a time
  const auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  for (auto& spec : src.specs) {
    if (spec.name.find("selection_bias") != std::string::npos) continue;  // checked (must be zero) in pass 2
    for (auto& [name, t] : gguf_tensors(a, src.model, spec.name, at::empty(spec.shape, meta))) {
      const auto type = storage(name, t.sizes(), opt.dtype);
      r.f16_fallbacks += opt.dtype == Type::Q8_0 && t.dim() >= 2 && type == Type::F16;
      w.add_tensor(name, t.sizes(), type);
      ++r.tensors;
    }
  }
  fs::create_directories(fs::absolute(out).parent_path());
  w.open(out);
  for (auto& spec : src.specs) {
    const auto tensors = gguf_tensors(a, src.model, spec.name, src.read(spec));
    if (spec.name.find("selection_bias") != std::string::npos) continue;
    for (auto& [name, t] : tensors) w.write(t);
  }
  w.finish();
  r.bytes = static_cast<int64_t>(fs::file_size(out));
  return r;
}

}  // namespace mf::gguf
