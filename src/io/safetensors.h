// safetensors reader/writer. Format: u64 little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets:[b,e]}, "__metadata__": {str: str}}, then the
// raw little-endian data. Written by hand: no C++ safetensors library ships in Debian.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mf {

// A JSON file (config.json, an index, trainer_state.json): FormatError naming the file when it
// is not valid JSON or nests deeper than kMaxJsonDepth.
nlohmann::json read_json_file(const std::string& path);

class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using Metadata = std::map<std::string, std::string>;

struct SafetensorsData {
  std::map<std::string, at::Tensor> tensors;
  Metadata metadata;
  const at::Tensor& at(const std::string& name) const;  // throws FormatError if missing
};

// A stored tensor must have the dtype its destination holds: relabelled bytes of another dtype
// of the same size would otherwise load as silently converted values. `where` names the file.
void require_dtype(const std::string& where, const std::string& name, at::ScalarType stored, at::ScalarType expected);

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});

// A file written tensor by tensor (never all in memory): the header from the declared names,
// dtypes and shapes, then each tensor's bytes in that order; finish() fsyncs and renames it into
// place, destruction before finish() removes the partial file.
struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, const Metadata& metadata = {});
  ~SafetensorsWriter();
  void write(const at::Tensor& t);  // the next declared tensor (dtype and shape checked)
  void finish();

 private:
  std::string path_, tmp_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
  std::ofstream out_;
  bool done_ = false;
};
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Validates everything (lengths, JSON, dtypes, shapes, offsets in bounds, no overlap,
// no holes) and throws FormatError naming the file and the problem.
SafetensorsData parse_safetensors(const std::string& bytes, const std::string& source);
SafetensorsData load_safetensors(const std::string& path);

// What the JSON header says: each tensor's dtype, shape and byte range in the data section.
struct SafetensorsHeader {
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // relative to data_start
  };
  std::map<std::string, Entry> tensors;
  Metadata metadata;
  uint64_t data_start = 0;
};

// A file opened by its header (validated as parse_safetensors does) whose tensors are read one
// at a time on demand: a checkpoint larger than memory is streamed tensor by tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const SafetensorsHeader& header() const { return header_; }
  const Metadata& metadata() const { return header_.metadata; }
  const std::string& path() const { return path_; }
  at::Tensor read(const std::string& name) const;  // throws FormatError naming the file and tensor
  // into an existing tensor of the same shape (same dtype on the CPU: read in place)
  void read_into(const std::string& name, at::Tensor& dst) const;

 private:
  const SafetensorsHeader::Entry& entry(const std::string& name) const;
  void read_bytes(const std::string& name, const SafetensorsHeader::Entry& e, char* out) const;
  std::string path_;
  SafetensorsHeader header_;
};

}  // namespace mf
