#include "io/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/util.h"
#include "data/tokenizer.h"
#include "io/safetensors_shards.h"

namespace mf {
namespace fs = std::filesystem;

namespace {

// A checkpoint directory is complete when every file write_checkpoint writes is there; an
// incomplete one (left by a kill under an older version) is invisible to readers.
bool complete(const fs::path& dir) {
  return has_safetensors_set(dir.string(), "model") && has_safetensors_set(dir.string(), "optimizer") &&
         fs::is_regular_file(dir / "trainer_state.json");
}

fs::path tmp_dir_of(const fs::path& final_dir) {
  return final_dir.parent_path() / (".tmp-" + final_dir.filename().string());
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

// The finished temporary directory becomes `final_dir` in one rename.
void publish(const fs::path& tmp, const fs::path& final_dir) {
  failpoint("checkpoint.written");
  if (fs::exists(final_dir)) remove_atomically(final_dir);  // the same step written again (after a resume)
  fs::rename(tmp, final_dir);
  fsync_dir(final_dir.parent_path().string());
  failpoint("checkpoint.renamed");
}

void write_rest(const fs::path& tmp, const CheckpointContents& c) {
  write_file_atomic((tmp / "trainer_state.json").string(), c.trainer_state.dump(2) + "\n");
  if (!c.tokenizer_file.empty()) copy_tokenizer(c.tokenizer_file, tmp.string());
}

NamedTensors shard_of(const NamedTensors& all, int rank, int world) {
  const auto plan = shard_plan(all, world);
  NamedTensors mine;
  for (size_t i = 0; i < all.size(); ++i)
    if (plan[i] == rank) mine.push_back(all[i]);
  return mine;
}

void write_index(const fs::path& tmp, const std::string& stem, const NamedTensors& all, int world) {
  const auto plan = shard_plan(all, world);
  nlohmann::json index = {{"metadata", {{"total_size", 0}, {"moeforge.world_size", world}}},
                          {"weight_map", nlohmann::json::object()}};
  int64_t bytes = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    index["weight_map"][all[i].first] = shard_file_name(stem, static_cast<size_t>(plan[i]), static_cast<size_t>(world));
    bytes += all[i].second.numel() * static_cast<int64_t>(all[i].second.element_size());
  }
  index["metadata"]["total_size"] = bytes;
  write_file_atomic((tmp / index_file_name(stem)).string(), index.dump(2) + "\n");
}

}  // namespace

std::vector<int> shard_plan(const NamedTensors& tensors, int world) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  auto bytes = [&](size_t i) {
    return tensors[i].second.numel() * static_cast<int64_t>(tensors[i].second.element_size());
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> plan(tensors.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    plan[i] = static_cast<int>(r);
    load[r] += bytes(i);
  }
  return plan;
}

void begin_sharded_checkpoint(const std::string& dir) {
  const auto tmp = tmp_dir_of(dir);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
}

void write_checkpoint_shard(const std::string& dir, const CheckpointContents& c, int rank, int world) {
  const auto tmp = tmp_dir_of(dir);
  save_safetensors((tmp / shard_file_name("model", static_cast<size_t>(rank), static_cast<size_t>(world))).string(),
                   shard_of(c.model, rank, world), c.model_metadata);
  failpoint("checkpoint.model_written");
  save_safetensors((tmp / shard_file_name("optimizer", static_cast<size_t>(rank), static_cast<size_t>(world))).string(),
                   shard_of(c.optimizer, rank, world));
}

void finish_sharded_checkpoint(const std::string& dir, const CheckpointContents& c, int world) {
  const auto tmp = tmp_dir_of(dir);
  write_index(tmp, "model", c.model, world);
  write_index(tmp, "optimizer", c.optimizer, world);
  write_rest(tmp, c);
  publish(tmp, dir);
}

void write_checkpoint(const std::string& dir, const CheckpointContents& c) {
  fs::path final_dir(dir);
  fs::path tmp = tmp_dir_of(final_dir);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    if (c.write_model)
      c.write_model((tmp / "model.safetensors").string());
    else
      save_safetensors((tmp / "model.safetensors").string(), c.model, c.model_metadata);
    failpoint("checkpoint.model_written");
    save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer);
    write_rest(tmp, c);
  } catch (...) {
    fs::remove_all(tmp);  // the previous checkpoint (if any) stays as it was
    throw;
  }
  publish(tmp, final_dir);
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
  if (!has_safetensors_set(p.string(), "model"))
    throw FormatError(
        fmt::format("'{}' is not a checkpoint (no model.safetensors, no complete {})", path, index_file_name("model")));
  return p.string();
}

Checkpoint read_checkpoint(const std::string& path) {
  Checkpoint c;
  c.dir = checkpoint_dir(path);
  c.model = SafetensorsShards(c.dir, "model").load_all();
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

SafetensorsData Checkpoint::optimizer() const { return SafetensorsShards(dir, "optimizer").load_all(); }

int64_t gather_checkpoint(const std::string& checkpoint, const std::string& out) {
  const auto dir = checkpoint_dir(checkpoint);
  if (fs::exists(out) && fs::equivalent(out, dir))
    throw std::invalid_argument(fmt::format("gathering {} onto itself: name another output directory", dir));
  CheckpointContents c;
  const SafetensorsShards model(dir, "model"), optimizer(dir, "optimizer");
  // the model streamed one tensor at a time; the optimizer state read whole
  c.write_model = [&](const std::string& path) {
    std::vector<TensorSpec> specs;
    for (auto& n : model.names()) specs.push_back({n, model.entry(n).dtype, model.entry(n).shape});
    SafetensorsWriter w(path, specs, model.metadata());
    for (auto& n : model.names()) w.write(model.read(n));
    w.finish();
  };
  for (auto& n : optimizer.names()) c.optimizer.emplace_back(n, optimizer.read(n));
  c.trainer_state = read_json_file((fs::path(dir) / "trainer_state.json").string());
  c.tokenizer_file = tokenizer_in(dir);
  write_checkpoint(out, c);
  return static_cast<int64_t>(model.names().size() + optimizer.names().size());
}

}  // namespace mf
