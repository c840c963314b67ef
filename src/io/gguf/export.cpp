#include "io/gguf/export.h"

#include <fmt/format.h>

#include <filesystem>
#include <set>

#include "io/gguf/arch.h"
#include "io/gguf/vocab.h"
#include "io/hf/hf_dir.h"
#include "io/weight_source.h"

namespace mf::gguf {
namespace fs = std::filesystem;
namespace {

// The source's tensors in the model's order (a checkpoint and its Hugging Face directory give the
// same file); a tensor the model does not have (a method's own) has no place in llama.cpp.
std::vector<TensorSpec> ordered_specs(const WeightSource& src) {
  auto specs = hf::model_specs(src.config.model);
  std::set<std::string> known;
  for (auto& spec : specs) known.insert(spec.name);
  for (auto& spec : specs)
    if (!known.count(spec.name))
      throw ConfigError(
          fmt::format("export --format gguf: tensor '{}' of {} has no place in llama.cpp (a method's own tensor?)",
                      spec.name, src.dir));
  return specs;
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
  if (fs::is_directory(out))
    throw ConfigError(fmt::format("-o {}: a directory; --format gguf writes one file (e.g. -o model.gguf)", out));
  const auto src = open_weights(path);
  const auto& model = src.config.model;
  if (model.task != "lm") throw ConfigError("export --format gguf: only language models (model.task = lm)");
  const auto hf_type = !opt.arch.empty()      ? opt.arch
                       : !src.hf_type.empty() ? src.hf_type
                                              : hf::arch_for(model).model_type;
  nlohmann::json unused;
  hf::arch_named(hf_type, "--arch").write(model, unused);  // what Hugging Face's layout cannot hold
  const Arch& a = arch_for(hf_type, model);
  const auto specs = ordered_specs(src);
  ExportReport r{a.name};

  Writer w;
  w.set("general.architecture", a.name);
  w.set("general.name", fs::path(path).lexically_normal().filename().string());
  w.set("general.file_type", file_type(opt.dtype));
  if (opt.dtype == Type::Q8_0) w.set("general.quantization_version", uint32_t{2});
  write_hparams(w, a, model);
  if (!src.tokenizer.empty()) write_vocab(w, src.tokenizer, model.vocab_size), r.tokenizer = true;

  // pass 1: names, shapes and types, from shapes alone; pass 2: the bytes, one of our tensors at a time
  const auto meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  for (auto& spec : specs) {
    if (spec.name.find("selection_bias") != std::string::npos) continue;  // checked (must be zero) in pass 2
    for (auto& [name, t] : gguf_tensors(a, model, spec.name, at::empty(spec.shape, meta))) {
      const auto type = storage(name, t.sizes(), opt.dtype);
      r.f16_fallbacks += opt.dtype == Type::Q8_0 && t.dim() >= 2 && type == Type::F16;
      w.add_tensor(name, t.sizes(), type);
      ++r.tensors;
    }
  }
  fs::create_directories(fs::absolute(out).parent_path());
  w.open(out);
  for (auto& spec : specs) {
    const auto tensors = gguf_tensors(a, model, spec.name, src.read(spec).to(at::kFloat));
    if (spec.name.find("selection_bias") != std::string::npos) continue;
    for (auto& [name, t] : tensors) w.write(t);
  }
  w.finish();
  r.bytes = static_cast<int64_t>(fs::file_size(out));
  return r;
}

}  // namespace mf::gguf
