#include "io/safetensors_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace mf {
namespace fs = std::filesystem;

std::string shard_file_name(const std::string& stem, size_t index, size_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, index + 1, count);
}

std::string index_file_name(const std::string& stem) { return stem + ".safetensors.index.json"; }

namespace {
// The shard files an index lists, in first-listed order, and each tensor's file.
std::vector<std::string> listed_files(const fs::path& index_file, std::map<std::string, std::string>* listed) {
  const auto idx = read_json_file(index_file.string());
  if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
    throw FormatError(index_file.string() + ": no \"weight_map\" object");
  std::vector<std::string> files;
  for (auto& [name, file] : idx["weight_map"].items()) {
    if (!file.is_string())
      throw FormatError(fmt::format("{}: weight_map[\"{}\"] is not a file name", index_file.string(), name));
    const auto f = file.get<std::string>();
    if (f.empty() || f.size() > 255 || f.find('/') != std::string::npos || f.find("..") != std::string::npos ||
        f.find('\0') != std::string::npos)
      throw FormatError(fmt::format("{}: shard name \"{}\" must be a file name in the directory (at most 255 bytes)",
                                    index_file.string(), f));
    if (listed) (*listed)[name] = f;
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  return files;
}
}  // namespace

bool has_safetensors_set(const std::string& dir, const std::string& stem) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / (stem + ".safetensors"))) return true;
  if (!fs::is_regular_file(d / index_file_name(stem))) return false;
  try {
    for (auto& f : listed_files(d / index_file_name(stem), nullptr))
      if (!fs::is_regular_file(d / f)) return false;
  } catch (const FormatError&) {
    return false;
  }
  return true;
}

SafetensorsShards::SafetensorsShards(const std::string& dir, const std::string& stem) : dir_(dir), stem_(stem) {
  const auto index_file = fs::path(dir) / index_file_name(stem);
  std::vector<std::string> files;
  std::map<std::string, std::string> listed;  // tensor -> shard file the index names
  if (fs::is_regular_file(index_file)) {
    files = listed_files(index_file, &listed);
  } else if (fs::is_regular_file(fs::path(dir) / (stem + ".safetensors"))) {
    files.push_back(stem + ".safetensors");
  } else {
    throw FormatError(fmt::format("{}: neither {}.safetensors nor {}", dir, stem, index_file_name(stem)));
  }
  for (const auto& f : files) {
    const auto path = (fs::path(dir) / f).string();
    if (!fs::is_regular_file(path))
      throw FormatError(fmt::format("{}: the shard {} it lists is missing", index_file.string(), path));
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (auto& [name, e] : files_.back()->header().tensors) {
      if (where_.count(name)) throw FormatError(fmt::format("{}: tensor '{}' is stored twice", path, name));
      where_[name] = files_.size() - 1;
    }
  }
  for (auto& [name, f] : listed) {
    auto it = where_.find(name);
    if (it == where_.end() || files[it->second] != f)
      throw FormatError(fmt::format("{}: tensor '{}' is not in its shard {}", index_file.string(), name, f));
  }
}

std::string SafetensorsShards::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? dir_ : (fs::path(dir_) / fs::path(files_[it->second]->path()).filename()).string();
}

std::vector<std::string> SafetensorsShards::names() const {
  std::vector<std::string> out;
  for (auto& [name, f] : where_) out.push_back(name);
  return out;
}

const SafetensorsHeader::Entry& SafetensorsShards::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw FormatError(fmt::format("{}: tensor '{}' is missing", dir_, name));
  return files_[it->second]->header().tensors.at(name);
}

const Metadata& SafetensorsShards::metadata() const { return files_.front()->metadata(); }

at::Tensor SafetensorsShards::read(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw FormatError(fmt::format("{}: tensor '{}' is missing", dir_, name));
  return files_[it->second]->read(name);
}

void SafetensorsShards::read_into(const std::string& name, at::Tensor& dst) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw FormatError(fmt::format("{}: tensor '{}' is missing", dir_, name));
  files_[it->second]->read_into(name, dst);
}

int64_t SafetensorsShards::bytes() const {
  int64_t n = 0;
  for (auto& f : files_) n += static_cast<int64_t>(fs::file_size(f->path()));
  return n;
}

SafetensorsData SafetensorsShards::load_all() const {
  SafetensorsData d;
  d.metadata = metadata();
  for (auto& [name, f] : where_) d.tensors.emplace(name, files_[f]->read(name));
  return d;
}

}  // namespace mf
