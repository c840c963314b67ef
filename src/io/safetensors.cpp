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

namespace {

// The 8-byte length and the JSON header (padded to 8 bytes) of tensors laid out in `specs` order.
std::string header_bytes(const std::vector<TensorSpec>& specs, const Metadata& metadata, uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& s : specs) {
    if (s.name == "__metadata__") throw FormatError("tensor name '__metadata__' is reserved");
    if (header.contains(s.name)) throw FormatError(fmt::format("duplicate tensor name '{}'", s.name));
    const auto& d = by_type(s.dtype);
    uint64_t numel = 1;
    for (auto v : s.shape) numel *= static_cast<uint64_t>(v);
    header[s.name] = {{"dtype", d.name}, {"shape", s.shape}, {"data_offsets", {offset, offset + numel * d.size}}};
    offset += numel * d.size;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align data to 8 bytes
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  if (data_bytes) *data_bytes = offset;
  return out + h;
}

}  // namespace

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  std::vector<TensorSpec> specs;
  std::vector<at::Tensor> contiguous;
  for (const auto& [name, t] : tensors) {
    contiguous.push_back(t.detach().to(at::kCPU).contiguous());
    specs.push_back({name, contiguous.back().scalar_type(), contiguous.back().sizes().vec()});
  }
  uint64_t data = 0;
  std::string out = header_bytes(specs, metadata, &data);
  out.reserve(out.size() + data);
  for (const auto& c : contiguous) out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, const Metadata& metadata)
    : path_(std::move(path)), tmp_(path_ + ".partial"), specs_(std::move(specs)) {
  const auto header = header_bytes(specs_, metadata, nullptr);
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error(fmt::format("cannot create '{}'", tmp_));
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!done_) {
    out_.close();
    std::remove(tmp_.c_str());
  }
}

void SafetensorsWriter::write(const at::Tensor& t) {
  if (next_ >= specs_.size()) throw FormatError(fmt::format("{}: more tensors than declared", path_));
  const auto& s = specs_[next_++];
  auto c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() != s.dtype || c.sizes().vec() != s.shape)
    throw FormatError(fmt::format("{}: tensor '{}' is {} {}; declared {} {}", path_, s.name,
                                  c10::toString(c.scalar_type()), c10::str(c.sizes()), c10::toString(s.dtype),
                                  c10::str(s.shape)));
  out_.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!out_) throw std::runtime_error(fmt::format("write to '{}' failed (disk full?)", tmp_));
}

void SafetensorsWriter::finish() {
  if (next_ != specs_.size())
    throw FormatError(fmt::format("{}: {} of {} tensors written", path_, next_, specs_.size()));
  out_.close();
  if (!out_) throw std::runtime_error(fmt::format("write to '{}' failed (disk full?)", tmp_));
  fsync_file(tmp_);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error(fmt::format("cannot rename '{}' to '{}'", tmp_, path_));
  done_ = true;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

namespace {

uint64_t header_length(const char* first8) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(first8[i])) << (8 * i);
  return n;
}

void check_header_length(uint64_t n, uint64_t file_size, const std::string& src) {
  if (n > kMaxHeader)
    throw FormatError(fmt::format("{}: not a valid safetensors file: header length {} is implausible (> {} bytes)", src,
                                  n, kMaxHeader));
  if (n > file_size - 8)
    throw FormatError(
        fmt::format("{}: not a valid safetensors file: header length {} exceeds the file size {} "
                    "(truncated?)",
                    src, n, file_size));
}

// Parses and validates the JSON header against `data_size` bytes of tensor data.
SafetensorsHeader parse_header(const char* json, uint64_t n, uint64_t data_size, const std::string& src) {
  auto fail = [&](const std::string& why) {
    return FormatError(fmt::format("{}: not a valid safetensors file: {}", src, why));
  };
  nlohmann::json header;
  if (json_depth(std::string_view(json, n)) > kMaxJsonDepth)
    throw fail(fmt::format("header nests deeper than {} levels", kMaxJsonDepth));
  try {
    header = nlohmann::json::parse(json, json + n);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  SafetensorsHeader out;
  out.data_start = 8 + n;
  std::vector<const SafetensorsHeader::Entry*> spans;
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
    SafetensorsHeader::Entry t;
    t.dtype = d->type;
    uint64_t numel = 1;
    if (!entry["shape"].is_array()) throw fail(fmt::format("tensor '{}' shape is not an array", name));
    for (auto& s : entry["shape"]) {
      if (!s.is_number_unsigned()) throw fail(fmt::format("tensor '{}' has a bad dimension {}", name, s.dump()));
      uint64_t dim = s.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && numel > (1ull << 40) / dim))
        throw fail(fmt::format("tensor '{}' is implausibly large", name));
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw fail(fmt::format("tensor '{}' data_offsets must be two non-negative integers", name));
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      throw fail(fmt::format("tensor '{}' data_offsets [{}, {}] out of bounds (data is {} bytes; truncated?)", name,
                             t.begin, t.end, data_size));
    if (t.end - t.begin != numel * d->size)
      throw fail(fmt::format("tensor '{}' has {} bytes but shape needs {}", name, t.end - t.begin, numel * d->size));
    spans.push_back(&out.tensors.emplace(name, std::move(t)).first->second);
  }
  std::sort(spans.begin(), spans.end(),
            [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  uint64_t cursor = 0;
  auto name_of = [&](const SafetensorsHeader::Entry* e) {
    for (auto& [k, v] : out.tensors)
      if (&v == e) return k;
    return std::string();
  };
  for (const auto* s : spans) {
    if (s->begin < cursor) throw fail(fmt::format("tensor '{}' overlaps another tensor", name_of(s)));
    if (s->begin > cursor) throw fail(fmt::format("hole in data before tensor '{}'", name_of(s)));
    cursor = s->end;
  }
  if (cursor != data_size) throw fail(fmt::format("{} trailing bytes after the last tensor", data_size - cursor));
  return out;
}

at::Tensor tensor_of(const SafetensorsHeader::Entry& e, const char* bytes) {
  auto t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes, e.end - e.begin);
  return t;
}

}  // namespace

SafetensorsData parse_safetensors(const std::string& bytes, const std::string& src) {
  if (bytes.size() < 8)
    throw FormatError(
        fmt::format("{}: not a valid safetensors file: file is {} bytes, shorter than the 8-byte "
                    "header length",
                    src, bytes.size()));
  const uint64_t n = header_length(bytes.data());
  check_header_length(n, bytes.size(), src);
  const auto header = parse_header(bytes.data() + 8, n, bytes.size() - 8 - n, src);
  SafetensorsData out;
  out.metadata = header.metadata;
  for (auto& [name, e] : header.tensors)
    out.tensors.emplace(name, tensor_of(e, bytes.data() + header.data_start + e.begin));
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

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw FormatError(fmt::format("{}: cannot open the file", path));
  const auto size = static_cast<uint64_t>(f.tellg());
  char first8[8];
  f.seekg(0);
  if (size < 8 || !f.read(first8, 8))
    throw FormatError(fmt::format("{}: not a valid safetensors file: shorter than the 8-byte header length", path));
  const uint64_t n = header_length(first8);
  check_header_length(n, size, path);
  std::string json(n, '\0');
  f.read(json.data(), static_cast<std::streamsize>(n));
  header_ = parse_header(json.data(), n, size - 8 - n, path);
}

const SafetensorsHeader::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) throw FormatError(fmt::format("{}: no tensor named '{}'", path_, name));
  return it->second;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const auto& e = entry(name);
  auto t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  read_bytes(name, e, static_cast<char*>(t.data_ptr()));
  return t;
}

void SafetensorsFile::read_into(const std::string& name, at::Tensor& dst) const {
  const auto& e = entry(name);
  if (dst.sizes() != at::IntArrayRef(e.shape))
    throw FormatError(fmt::format("{}: tensor '{}' has shape {} in the file but {} in the model", path_, name,
                                  c10::str(at::IntArrayRef(e.shape)), c10::str(dst.sizes())));
  require_dtype(path_, name, e.dtype, dst.scalar_type());
  if (dst.is_contiguous() && dst.device().is_cpu()) {
    read_bytes(name, e, static_cast<char*>(dst.data_ptr()));  // straight into place: no second copy
    dst.unsafeGetTensorImpl()->bump_version();                // as an in-place op would (moe/fused_units.h)
  } else
    dst.copy_(read(name));
}

void SafetensorsFile::read_bytes(const std::string& name, const SafetensorsHeader::Entry& e, char* out) const {
  std::ifstream f(path_, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(header_.data_start + e.begin));
  if (!f.read(out, static_cast<std::streamsize>(e.end - e.begin)))
    throw FormatError(fmt::format("{}: could not read tensor '{}' (file changed or truncated?)", path_, name));
}

void require_dtype(const std::string& where, const std::string& name, at::ScalarType stored, at::ScalarType expected) {
  if (stored != expected)
    throw FormatError(fmt::format("{}: tensor '{}' is stored as {} but must be {}", where, name, c10::toString(stored),
                                  c10::toString(expected)));
}

nlohmann::json read_json_file(const std::string& path) {
  const auto text = read_file(path);
  if (json_depth(text) > kMaxJsonDepth)
    throw FormatError(fmt::format("{}: JSON nests deeper than {} levels", path, kMaxJsonDepth));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

}  // namespace mf
