#include "io/hf/hf_dir.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "core/bf16.h"
#include "core/init.h"
#include "core/util.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/hf/tensors.h"
#include "io/model_io.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"

namespace mf::hf {
namespace fs = std::filesystem;

bool is_hf_dir(const std::string& path) {
  return fs::is_regular_file(fs::path(path) / "config.json") && !fs::exists(fs::path(path) / "trainer_state.json");
}

namespace {

// Sizes in config.json that imply far more parameters than the files hold would surface only
// after building every block at that size (minutes, gigabytes): refused first, naming the keys.
void check_implied_parameters(const HfDir& hf, const std::string& dir) {
  double stored = 0;
  for (const auto& name : hf.names()) {
    double n = 1;
    for (auto s : hf.entry(name).shape) n *= static_cast<double>(s);
    stored += n;
  }
  const double implied = approx_parameters(hf.config().model);
  if (implied > 4 * stored + 1e7)
    throw FormatError(
        fmt::format("{}/config.json: its sizes imply ~{:.3g} parameters but the safetensors files hold {:.3g}; check "
                    "\"hidden_size\", \"intermediate_size\", \"moe_intermediate_size\", \"num_experts\", "
                    "\"num_hidden_layers\" and \"vocab_size\"",
                    dir, implied, stored));
}

}  // namespace

HfDir::HfDir(const std::string& dir) : dir_(dir) {
  const auto config_file = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(config_file))
    throw FormatError(dir + ": not a Hugging Face model directory (no config.json)");
  const auto j = read_json_file(config_file);
  if (!j.is_object()) throw FormatError(config_file + ": not a JSON object");
  const ConfigReader r(j, config_file);
  arch_ = &arch_named(r.text("model_type", ""), config_file);
  arch_->read(r, cfg_.model);
  cfg_.train.seq_len = std::min(cfg_.train.seq_len, cfg_.model.max_seq_len);
  try {
    validate(cfg_);
  } catch (const ConfigError& e) {
    throw FormatError(fmt::format("{}: {}", config_file, e.what()));
  }
  tensors_ = std::make_unique<SafetensorsShards>(dir, "model");  // one file, or the shards an index lists
  check_implied_parameters(*this, dir);
}

at::Tensor HfDir::read(const std::string& name) const { return tensors_->read(name); }

const SafetensorsHeader::Entry& HfDir::entry(const std::string& name) const { return tensors_->entry(name); }

at::Tensor HfDir::ours(const std::string& name, at::IntArrayRef shape, std::vector<std::string>& used,
                       bool keep_bf16) const {
  const auto weight = [&](const std::string& n) {
    auto t = read(n);
    if (!at::isFloatingType(t.scalar_type()))  // an integer label on a weight is a damaged file, not a conversion
      throw FormatError(
          fmt::format("{}: tensor '{}' is stored as {}, an integer dtype; a model weight must be F32, F16 or BF16",
                      dir_, n, c10::toString(t.scalar_type())));
    if (keep_bf16 && t.scalar_type() == at::kBFloat16) return t;
    return widened(t, at::kFloat).to(at::kFloat);  // F16 and F32 by LibTorch, BF16 vectorised
  };
  return import_tensor(*arch_, name, shape, weight, used);
}

void HfDir::check_all_read(const std::vector<std::string>& used) const {
  const std::set<std::string> read(used.begin(), used.end());
  for (auto& name : tensors_->names())
    if (!read.count(name) && !ignorable_hf_tensor(name, cfg_.model.tie_embeddings))
      throw FormatError(fmt::format("{}: tensor '{}' has no place in the {} model config.json describes", dir_, name,
                                    arch_->model_type));
}

std::vector<std::string> HfDir::names() const { return tensors_->names(); }

std::vector<TensorSpec> model_specs(const ModelConfig& c) {
  std::vector<TensorSpec> specs = {{"model.embed_tokens.weight", at::kFloat, {c.vocab_size, c.d_model}}};
  const auto plan = plan_moe(c);
  const ShapesOnly shapes;                    // no random initialisation: minutes for a large model
  for (int64_t i = 0; i < c.n_layers; ++i) {  // one block in memory at a time
    DecoderBlock block(c, i, plan);
    const auto prefix = fmt::format("model.layers.{}.", i);
    for (auto& p : block->named_parameters()) specs.push_back({prefix + p.key(), at::kFloat, p.value().sizes().vec()});
    for (auto& b : block->named_buffers())
      specs.push_back({prefix + b.key(), b.value().scalar_type(), b.value().sizes().vec()});
  }
  specs.push_back({"model.norm.weight", at::kFloat, {c.d_model}});
  if (!c.tie_embeddings) specs.push_back({"lm_head.weight", at::kFloat, {c.vocab_size, c.d_model}});
  return specs;
}

ImportReport import_hf(const std::string& dir, const std::string& out) {
  HfDir hf(dir);
  const auto& cfg = hf.config();
  const auto specs = model_specs(cfg.model);
  ImportReport r{hf.arch().model_type};
  const Metadata meta = step0_metadata(cfg, hf.arch().model_type);
  CheckpointContents contents{{}, {}, meta, {{"step", 0}, {"imported_from", dir}}, tokenizer_in(dir)};
  contents.write_model = [&](const std::string& path) {  // one of our tensors in memory at a time
    SafetensorsWriter w(path, specs, meta);
    std::vector<std::string> used;
    for (const auto& s : specs) {
      auto t = hf.ours(s.name, s.shape, used);
      w.write(t.to(s.dtype));
      r.parameters += t.numel();
    }
    hf.check_all_read(used);
    r.tensors_read = static_cast<int64_t>(std::set<std::string>(used.begin(), used.end()).size());
    w.finish();
  };
  write_checkpoint(out, contents);
  return r;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "f16" || name == "float16") return at::kHalf;
  throw ConfigError(fmt::format("--dtype {}: use f32, bf16 or f16", name));
}

int64_t parse_size(const std::string& text) {
  static const std::regex re(R"(^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KIB|MIB|GIB)?\s*$)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw ConfigError(fmt::format("size \"{}\": use e.g. 5GB, 500MB or 2000000", text));
  std::string unit = m[2].str();
  std::transform(unit.begin(), unit.end(), unit.begin(), ::toupper);
  const std::map<std::string, double> scale = {{"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
                                               {"GB", 1e9}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  const double v = std::stod(m[1].str()) * scale.at(unit);
  if (v < 1) throw ConfigError(fmt::format("size \"{}\" must be at least one byte", text));
  return static_cast<int64_t>(v);
}

ExportReport export_hf(const std::string& checkpoint, const std::string& out, const ExportOptions& opt) {
  const auto cfg = checkpoint_config(checkpoint);
  if (cfg.model.task != "lm")
    throw ConfigError("export: only language models export to Hugging Face (model.task = lm)");
  const Arch& a = opt.arch.empty() ? arch_for(cfg.model) : arch_named(opt.arch, "--arch");
  nlohmann::json j = nlohmann::json::object();
  a.write(cfg.model, j);
  j["model_type"] = a.model_type;
  j["architectures"] = {a.hf_class};
  j["torch_dtype"] = opt.dtype == at::kFloat ? "float32" : opt.dtype == at::kBFloat16 ? "bfloat16" : "float16";
  const auto dir = checkpoint_dir(checkpoint);
  const SafetensorsShards ours(dir, "model");

  const fs::path final_dir(out), tmp = final_dir.parent_path() / (".tmp-" + final_dir.filename().string());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  ExportReport r{a.model_type};
  // pass 1: every HF tensor's name and shape, assigned to shards in order
  std::vector<std::vector<TensorSpec>> shards(1);
  int64_t shard_size = 0;
  for (auto& name : ours.names())
    for (auto& [hf_name, t] : export_tensor(a, name, ours.read(name))) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(c10::elementSize(opt.dtype));
      if (shard_size > 0 && shard_size + bytes > opt.shard_bytes) shards.emplace_back(), shard_size = 0;
      shards.back().push_back({hf_name, opt.dtype, t.sizes().vec()});
      shard_size += bytes;
      r.bytes += bytes;
      ++r.tensors;
    }
  r.shards = static_cast<int64_t>(shards.size());
  auto file_of = [&](size_t i) {
    return r.shards == 1 ? std::string("model.safetensors")
                         : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, r.shards);
  };
  // pass 2: the same tensors again, written shard after shard (one of ours in memory at a time)
  size_t shard = 0, next = 0;
  auto writer = std::make_unique<SafetensorsWriter>((tmp / file_of(0)).string(), shards[0], Metadata{{"format", "pt"}});
  for (auto& name : ours.names())
    for (auto& [hf_name, t] : export_tensor(a, name, ours.read(name))) {
      if (next == shards[shard].size()) {
        writer->finish();
        ++shard, next = 0;
        writer = std::make_unique<SafetensorsWriter>((tmp / file_of(shard)).string(), shards[shard],
                                                     Metadata{{"format", "pt"}});
      }
      writer->write(t.to(opt.dtype));
      ++next;
    }
  writer->finish();
  if (r.shards > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", r.bytes}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t i = 0; i < shards.size(); ++i)
      for (auto& s : shards[i]) index["weight_map"][s.name] = file_of(i);
    write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  write_file_atomic((tmp / "config.json").string(), j.dump(2) + "\n");
  if (const auto tokenizer = tokenizer_in(dir); !tokenizer.empty()) copy_tokenizer(tokenizer, tmp.string());
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  return r;
}

}  // namespace mf::hf
