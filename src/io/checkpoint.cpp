#include "io/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/util.h"
#include "data/tokenizer.h"

namespace mf {
namespace fs = std::filesystem;

namespace {

// A checkpoint directory is complete when every file write_checkpoint writes is there; an
// incomplete one (left by a kill under an older version) is invisible to readers.
bool complete(const fs::path& dir) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"})
    if (!fs::is_regular_file(dir / f)) return false;
  return true;
}

// The complete step_* directories under `root`, oldest first.
std::vector<fs::path> step_dirs(const fs::path& root) {
  std::vector<fs::path> dirs;
  if (!fs::is_directory(root)) return dirs;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0 && complete(e.path()))
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());  // zero-padded step numbers sort lexically
  return dirs;
}

// Removal as atomic as creation: out of the step_* namespace by one rename, then deleted.
void remove_atomically(const fs::path& dir) {
  const auto doomed = dir.parent_path() / (".del-" + dir.filename().string());
  fs::remove_all(doomed);
  fs::rename(dir, doomed);
  fsync_dir(dir.parent_path().string());
  failpoint("checkpoint.moved_out");
  fs::remove_all(doomed);
}

}  // namespace

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
    failpoint("checkpoint.model_written");
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer);
    write_file_atomic((tmp / "trainer_state.json").string(), c.trainer_state.dump(2) + "\n");
    if (!c.tokenizer_file.empty()) copy_tokenizer(c.tokenizer_file, tmp.string());
  } catch (...) {
    fs::remove_all(tmp);  // the previous checkpoint (if any) stays as it was
    throw;
  }
  failpoint("checkpoint.written");
  if (fs::exists(final_dir)) remove_atomically(final_dir);  // the same step written again (after a resume)
  fs::rename(tmp, final_dir);
  fsync_dir(final_dir.parent_path().string());
  failpoint("checkpoint.renamed");
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto dirs = step_dirs(fs::path(run_dir) / "checkpoints");
  return dirs.empty() ? "" : dirs.back().string();
}

void prune_checkpoints(const std::string& ckpt_root, int64_t keep) {
  if (keep <= 0) return;
  const auto dirs = step_dirs(ckpt_root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i) remove_atomically(dirs[i]);
}

int clean_checkpoint_leftovers(const std::string& ckpt_root) {
  int removed = 0;
  if (!fs::is_directory(ckpt_root)) return 0;
  std::vector<fs::path> leftovers;
  for (auto& e : fs::directory_iterator(ckpt_root)) {
    const auto name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".del-", 0) == 0 ||
        (name.rfind("step_", 0) == 0 && e.is_directory() && !complete(e.path())))
      leftovers.push_back(e.path());
  }
  for (const auto& p : leftovers) removed += fs::remove_all(p) > 0;
  return removed;
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
  return read_json_file((fs::path(dir) / "trainer_state.json").string());
}

SafetensorsData Checkpoint::optimizer() const {
  return load_safetensors((fs::path(dir) / "optimizer.safetensors").string());
}

}  // namespace mf
