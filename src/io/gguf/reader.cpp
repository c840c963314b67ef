// GGUF read back: metadata as JSON text and every tensor decoded to float32. For checking
// files (tests, small models); llama.cpp itself is the reader that matters.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/util.h"
#include "io/gguf/writer.h"
#include "io/safetensors.h"  // FormatError

namespace mf::gguf {
namespace {

class Cursor {
 public:
  Cursor(std::string bytes, std::string path) : b_(std::move(bytes)), path_(std::move(path)) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string text() {
    const auto n = get<uint64_t>();
    need(n);
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }
  nlohmann::json value(uint32_t type) {
    switch (type) {
      case 0: return get<uint8_t>();
      case 1: return get<int8_t>();
      case 2: return get<uint16_t>();
      case 3: return get<int16_t>();
      case 4: return get<uint32_t>();
      case 5: return get<int32_t>();
      case 6: return get<float>();
      case 7: return get<uint8_t>() != 0;
      case 8: return text();
      case 10: return get<uint64_t>();
      case 11: return get<int64_t>();
      case 12: return get<double>();
      case 9: {
        const auto inner = get<uint32_t>();
        const auto n = get<uint64_t>();
        auto a = nlohmann::json::array();
        for (uint64_t i = 0; i < n; ++i) a.push_back(value(inner));
        return a;
      }
      default: throw FormatError(fmt::format("{}: unknown GGUF value type {} at byte {}", path_, type, at_));
    }
  }
  void need(uint64_t n) const {
    if (at_ > b_.size() || n > b_.size() - at_) throw FormatError(fmt::format("{}: truncated at byte {}", path_, at_));
  }
  size_t at_ = 0;
  std::string b_, path_;
};

}  // namespace

File read(const std::string& path) {
  Cursor c(read_file(path), path);
  if (c.b_.compare(0, 4, "GGUF") != 0) throw FormatError(path + ": not a GGUF file");
  c.at_ = 4;
  if (const auto v = c.get<uint32_t>(); v != 3) throw FormatError(fmt::format("{}: GGUF version {}", path, v));
  const auto n_tensors = c.get<uint64_t>(), n_kv = c.get<uint64_t>();
  File f;
  for (uint64_t i = 0; i < n_kv; ++i) {
    auto k = c.text();
    f.metadata.emplace_back(k, c.value(c.get<uint32_t>()).dump());
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    File::Tensor t;
    t.name = c.text();
    const auto dims = c.get<uint32_t>();
    for (uint32_t d = 0; d < dims; ++d) t.shape.insert(t.shape.begin(), static_cast<int64_t>(c.get<uint64_t>()));
    t.type = static_cast<Type>(c.get<uint32_t>());
    offsets.push_back(c.get<uint64_t>());
    f.tensors.push_back(std::move(t));
  }
  const uint64_t data = (c.at_ + Writer::kAlignment - 1) / Writer::kAlignment * Writer::kAlignment;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    auto& t = f.tensors[i];
    const auto n = static_cast<uint64_t>(encoded_bytes(t.shape, t.type));
    c.at_ = data + offsets[i];
    c.need(n);
    t.value = decode(c.b_.substr(c.at_, n), t.shape, t.type);
  }
  return f;
}

std::string File::value(const std::string& key) const {
  for (auto& [k, v] : metadata)
    if (k == key) return v;
  return "";
}

const File::Tensor& File::tensor(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return t;
  throw FormatError("no tensor '" + name + "' in the GGUF file");
}

}  // namespace mf::gguf
