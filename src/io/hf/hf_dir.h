// Hugging Face model directories: config.json + model.safetensors, or shards listed by
// model.safetensors.index.json. `moeforge import` turns one into a checkpoint of ours,
// `moeforge export` writes one from a checkpoint (sharded, F32 / BF16 / F16).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "io/hf/arch.h"
#include "io/safetensors_shards.h"

namespace mf::hf {

bool is_hf_dir(const std::string& path);  // has config.json and no moeforge checkpoint

// Opened by headers only: tensors are read one at a time, from whichever shard holds them.
class HfDir {
 public:
  explicit HfDir(const std::string& dir);
  const Arch& arch() const { return *arch_; }
  const Config& config() const { return cfg_; }  // model keys from config.json, the rest our defaults
  bool has(const std::string& name) const { return tensors_->has(name); }
  at::Tensor read(const std::string& name) const;  // as stored (F32, F16 or BF16); FormatError names it
  std::vector<std::string> names() const;
  const SafetensorsHeader::Entry& entry(const std::string& name) const;  // dtype, shape
  // Our tensor `name` of `shape` in float32 from the stored tensors (import_tensor); adds what it read to `used`.
  // `keep_bf16`: tensors stored in BF16 stay BF16 (a model holding its weights in bf16 needs no float32 copy).
  at::Tensor ours(const std::string& name, at::IntArrayRef shape, std::vector<std::string>& used,
                  bool keep_bf16 = false) const;
  // FormatError naming a stored tensor not in `read` that the model has no place for.
  void check_all_read(const std::vector<std::string>& read) const;

 private:
  std::string dir_;
  const Arch* arch_ = nullptr;
  Config cfg_;
  std::unique_ptr<SafetensorsShards> tensors_;
};

struct ImportReport {
  std::string arch;
  int64_t tensors_read = 0, parameters = 0;
};
// HF directory -> checkpoint directory `out` (float32), with the resolved config and the
// SentencePiece tokenizer when the directory has one. Streamed: one of our tensors (one
// layer's stacked experts at most) and the HF tensors it is built from are in memory at a time.
ImportReport import_hf(const std::string& hf_dir, const std::string& out);
// Our tensors of a decoder LM with config `c` (names, dtypes, shapes), built one block at a time.
std::vector<TensorSpec> model_specs(const ModelConfig& c);

struct ExportOptions {
  std::string arch;                                // "" = by the model's flags (arch_for)
  at::ScalarType dtype = at::kFloat;               // on disk
  int64_t shard_bytes = 5LL * 1000 * 1000 * 1000;  // the largest shard (one tensor may exceed it)
};
struct ExportReport {
  std::string arch;
  int64_t tensors = 0, shards = 0, bytes = 0;
};
// Our checkpoint -> HF directory `out` (config.json, model.safetensors
// or model-0000i-of-0000N.safetensors + index, tokenizer.model if the checkpoint has one).
// Streamed: reads our checkpoint twice, one tensor at a time (shard plan, then the bytes).
ExportReport export_hf(const std::string& checkpoint, const std::string& out, const ExportOptions& opt);

at::ScalarType parse_dtype(const std::string& name);  // f32 | bf16 | f16 (ConfigError otherwise)
int64_t parse_size(const std::string& text);          // "5GB", "500MB", "2000000" (ConfigError otherwise)

}  // namespace mf::hf
