#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util.h"

namespace mf {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  size_t size;
};
const DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* by_name(const std::string& n) {
  for (auto& d : kDtypes)
    if (n == d.name) return &d;
  return nullptr;
}
const DtypeInfo& by_type(at::ScalarType t) {
  for (auto& d : kDtypes)
    if (t == d.type) return d;
  throw FormatError(fmt::format("safetensors: unsupported dtype {}", c10::toString(t)));
}

}  // namespace

const at::Tensor& SafetensorsData::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw FormatError(fmt::format("tensor '{}' missing from checkpoint", name));
  return it->second;
}

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw FormatError("tensor name '__metadata__' is reserved");
    if (header.contains(name)) throw FormatError(fmt::format("duplicate tensor name '{}'", name));
    auto c = t.detach().to(at::kCPU).contiguous();
    const auto& d = by_type(c.scalar_type());
    uint64_t nbytes = static_cast<uint64_t>(c.numel()) * d.size;
    header[name] = {{"dtype", d.name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(c);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align data to 8 bytes
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& c : contiguous) out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

SafetensorsData parse_safetensors(const std::string& bytes, const std::string& src) {
  auto fail = [&](const std::string& why) {
    return FormatError(fmt::format("{}: not a valid safetensors file: {}", src, why));
  };
  if (bytes.size() < 8)
    throw fail(fmt::format("file is {} bytes, shorter than the 8-byte header length", bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > kMaxHeader) throw fail(fmt::format("header length {} is implausible (> {} bytes)", n, kMaxHeader));
  if (n > bytes.size() - 8)
    throw fail(fmt::format("header length {} exceeds the file size {} (truncated?)", n, bytes.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  SafetensorsData out;
  struct Span {
    uint64_t b, e;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail(fmt::format("__metadata__ value of '{}' is not a string", k));
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw fail(fmt::format("tensor '{}' lacks dtype/shape/data_offsets", name));
    const auto& jd = entry["dtype"];
    const DtypeInfo* d = jd.is_string() ? by_name(jd.get<std::string>()) : nullptr;
    if (!d) throw fail(fmt::format("tensor '{}' has unsupported dtype {}", name, jd.dump()));
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    if (!entry["shape"].is_array()) throw fail(fmt::format("tensor '{}' shape is not an array", name));
    for (auto& s : entry["shape"]) {
      if (!s.is_number_unsigned()) throw fail(fmt::format("tensor '{}' has a bad dimension {}", name, s.dump()));
      uint64_t dim = s.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && numel > (1ull << 40) / dim))
        throw fail(fmt::format("tensor '{}' is implausibly large", name));
      numel *= dim;
      shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw fail(fmt::format("tensor '{}' data_offsets must be two non-negative integers", name));
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_size)
      throw fail(fmt::format("tensor '{}' data_offsets [{}, {}] out of bounds (data is {} bytes; truncated?)", name, b,
                             e, data_size));
    if (e - b != numel * d->size)
      throw fail(fmt::format("tensor '{}' has {} bytes but shape needs {}", name, e - b, numel * d->size));
    spans.push_back({b, e, name});
    auto t = at::empty(shape, at::TensorOptions().dtype(d->type));
    if (numel) std::memcpy(t.data_ptr(), data + b, e - b);
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.b < b.b || (a.b == b.b && a.e < b.e); });
  uint64_t cursor = 0;
  for (const auto& s : spans) {
    if (s.b < cursor) throw fail(fmt::format("tensor '{}' overlaps another tensor", s.name));
    if (s.b > cursor) throw fail(fmt::format("hole in data before tensor '{}'", s.name));
    cursor = s.e;
  }
  if (cursor != data_size) throw fail(fmt::format("{} trailing bytes after the last tensor", data_size - cursor));
  return out;
}

SafetensorsData load_safetensors(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const std::exception& e) {
    throw FormatError(e.what());
  }
  return parse_safetensors(bytes, path);
}

Metadata read_safetensors_metadata(const std::string& path) { return load_safetensors(path).metadata; }

}  // namespace mf
