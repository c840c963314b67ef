#include "io/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/util.h"
#include "data/tokenizer.h"

namespace mf {
namespace fs = std::filesystem;

void write_checkpoint(const std::string& dir, const CheckpointContents& c) {
  fs::path final_dir(dir);
  fs::path tmp = final_dir.parent_path() / (".tmp-" + final_dir.filename().string());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    if (c.write_model)
      c.write_model((tmp / "model.safetensors").string());
    else
      save_safetensors((tmp / "model.safetensors").string(), c.model, c.model_metadata);
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer);
    write_file_atomic((tmp / "trainer_state.json").string(), c.trainer_state.dump(2) + "\n");
    if (!c.tokenizer_file.empty()) copy_tokenizer(c.tokenizer_file, tmp.string());
  } catch (...) {
    fs::remove_all(tmp);  // the previous checkpoint (if any) stays as it was
    throw;
  }
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(final_dir.parent_path().string());
}

std::string latest_checkpoint(const std::string& run_dir) {
  fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return "";
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) names.push_back(e.path().string());
  if (names.empty()) return "";
  std::sort(names.begin(), names.end());  // zero-padded step numbers sort lexically
  return names.back();
}

void prune_checkpoints(const std::string& ckpt_root, int64_t keep) {
  if (keep <= 0 || !fs::is_directory(ckpt_root)) return;
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(ckpt_root))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i) fs::remove_all(dirs[i]);
}

std::string checkpoint_dir(const std::string& path) {
  fs::path p(path);
  if (fs::is_regular_file(p)) p = p.parent_path();
  if (fs::is_directory(p / "checkpoints")) {
    auto latest = latest_checkpoint(p.string());
    if (latest.empty()) throw FormatError(fmt::format("run directory '{}' has no checkpoints", path));
    p = latest;
  }
  if (!fs::exists(p / "model.safetensors"))
    throw FormatError(fmt::format("'{}' is not a checkpoint (no model.safetensors)", path));
  return p.string();
}

Checkpoint read_checkpoint(const std::string& path) {
  Checkpoint c;
  c.dir = checkpoint_dir(path);
  c.model = load_safetensors((fs::path(c.dir) / "model.safetensors").string());
  return c;
}

std::string Checkpoint::tokenizer_path() const {
  const auto t = tokenizer_in(dir);
  return t.empty() ? (fs::path(dir) / "tokenizer.model").string() : t;  // the error then names the usual file
}

std::string config_toml_of(const Metadata& metadata, const std::string& dir) {
  auto it = metadata.find("moeforge.config");
  if (it == metadata.end())
    throw FormatError(fmt::format("{}: model.safetensors lacks the moeforge.config metadata", dir));
  return it->second;
}

std::string Checkpoint::config_toml() const { return config_toml_of(model.metadata, dir); }

nlohmann::json Checkpoint::trainer_state() const {
  auto f = (fs::path(dir) / "trainer_state.json").string();
  try {
    return nlohmann::json::parse(read_file(f));
  } catch (const std::exception& e) {
    throw FormatError(fmt::format("{}: unreadable trainer state: {}", f, e.what()));
  }
}

SafetensorsData Checkpoint::optimizer() const {
  return load_safetensors((fs::path(dir) / "optimizer.safetensors").string());
}

}  // namespace mf
