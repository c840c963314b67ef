// Tensors stored as one safetensors file `<stem>.safetensors`, or split over shard files
// `<stem>-0000i-of-0000N.safetensors` listed by `<stem>.safetensors.index.json` (Hugging Face's
// layout: {"metadata": {...}, "weight_map": {tensor: shard file}}), read as one set. Headers
// are read at open; tensors one at a time on demand.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace mf {

std::string shard_file_name(const std::string& stem, size_t index, size_t count);  // model-00001-of-00002.safetensors
std::string index_file_name(const std::string& stem);                              // model.safetensors.index.json
// Whether `dir` holds the set: the single file, or an index whose every listed shard exists.
bool has_safetensors_set(const std::string& dir, const std::string& stem);

class SafetensorsShards {
 public:
  // FormatError naming the directory when neither layout is there, an index lists a missing
  // shard or a tensor its shard lacks, or a tensor is stored twice.
  SafetensorsShards(const std::string& dir, const std::string& stem);
  const std::string& dir() const { return dir_; }
  std::string file_of(const std::string& name) const;  // the file that holds `name` (for messages)
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  std::vector<std::string> names() const;  // sorted
  const SafetensorsHeader::Entry& entry(const std::string& name) const;
  const Metadata& metadata() const;                // the first file's (a sharded checkpoint repeats it in every shard)
  at::Tensor read(const std::string& name) const;  // FormatError names the set and the tensor
  void read_into(const std::string& name, at::Tensor& dst) const;
  SafetensorsData load_all() const;
  size_t files() const { return files_.size(); }
  int64_t bytes() const;  // on disk, all files

 private:
  std::string dir_, stem_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> file
};

}  // namespace mf
