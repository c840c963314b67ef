#include "io/gguf/writer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/util.h"
#include "io/safetensors.h"  // FormatError

namespace mf::gguf {
namespace {

enum Value : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

template <class T>
void put_raw(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::string& s, const std::string& v) {
  put_raw<uint64_t>(s, v.size());
  s += v;
}

uint16_t half_bits(float x) {
  const at::Half h(x);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
float half_value(uint16_t bits) {
  at::Half h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

std::string q8_0(const at::Tensor& t) {
  const auto x = t.contiguous();
  const float* p = x.data_ptr<float>();
  std::string out;
  out.reserve(static_cast<size_t>(encoded_bytes(t.sizes(), Type::Q8_0)));
  for (int64_t b = 0; b < x.numel(); b += kQ8Block) {
    float amax = 0;
    for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(p[b + i]));
    const float d = amax / 127.0f, inv = d != 0 ? 1.0f / d : 0.0f;
    put_raw<uint16_t>(out, half_bits(d));
    for (int64_t i = 0; i < kQ8Block; ++i) put_raw<int8_t>(out, static_cast<int8_t>(std::round(p[b + i] * inv)));
  }
  return out;
}

at::Tensor from_q8_0(const std::string& bytes, at::IntArrayRef shape) {
  auto t = at::empty(shape, at::kFloat);
  float* p = t.data_ptr<float>();
  const char* in = bytes.data();
  for (int64_t b = 0; b < t.numel(); b += kQ8Block, in += 2 + kQ8Block) {
    uint16_t bits;
    std::memcpy(&bits, in, 2);
    const float d = half_value(bits);
    for (int64_t i = 0; i < kQ8Block; ++i) p[b + i] = d * static_cast<float>(static_cast<int8_t>(in[2 + i]));
  }
  return t;
}

}  // namespace

const char* type_name(Type t) { return t == Type::F32 ? "f32" : t == Type::F16 ? "f16" : "q8_0"; }

int64_t encoded_bytes(at::IntArrayRef shape, Type type) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return type == Type::F32 ? 4 * n : type == Type::F16 ? 2 * n : n / kQ8Block * (2 + kQ8Block);
}

std::string encode(const at::Tensor& t, Type type) {
  if (type == Type::Q8_0) {
    if (t.dim() == 0 || t.size(-1) % kQ8Block != 0)
      throw std::invalid_argument(fmt::format("q8_0 needs rows of a multiple of 32 values, not {}", t.size(-1)));
    return q8_0(t.to(at::kFloat));
  }
  const auto x = t.to(type == Type::F32 ? at::kFloat : at::kHalf).contiguous();
  return std::string(static_cast<const char*>(x.data_ptr()), x.nbytes());
}

at::Tensor decode(const std::string& bytes, at::IntArrayRef shape, Type type) {
  if (static_cast<int64_t>(bytes.size()) != encoded_bytes(shape, type))
    throw FormatError(
        fmt::format("{} bytes cannot hold a {} tensor of shape {}", bytes.size(), type_name(type), c10::str(shape)));
  if (type == Type::Q8_0) return from_q8_0(bytes, shape);
  auto t = at::empty(shape, type == Type::F32 ? at::kFloat : at::kHalf);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t.to(at::kFloat);
}

void Writer::key(const std::string& k, uint32_t value_type) {
  put_string(kv_, k);
  put_raw<uint32_t>(kv_, value_type);
  ++n_kv_;
}
void Writer::set(const std::string& k, uint32_t v) { key(k, kU32), put_raw(kv_, v); }
void Writer::set(const std::string& k, float v) { key(k, kF32), put_raw(kv_, v); }
void Writer::set(const std::string& k, bool v) { key(k, kBool), put_raw<uint8_t>(kv_, v ? 1 : 0); }
void Writer::set(const std::string& k, const std::string& v) { key(k, kString), put_string(kv_, v); }
void Writer::set(const std::string& k, const std::vector<std::string>& v) {
  key(k, kArray), put_raw<uint32_t>(kv_, kString), put_raw<uint64_t>(kv_, v.size());
  for (auto& s : v) put_string(kv_, s);
}
void Writer::set(const std::string& k, const std::vector<float>& v) {
  key(k, kArray), put_raw<uint32_t>(kv_, kF32), put_raw<uint64_t>(kv_, v.size());
  for (float f : v) put_raw(kv_, f);
}
void Writer::set(const std::string& k, const std::vector<int32_t>& v) {
  key(k, kArray), put_raw<uint32_t>(kv_, kI32), put_raw<uint64_t>(kv_, v.size());
  for (int32_t i : v) put_raw(kv_, i);
}

void Writer::add_tensor(const std::string& name, at::IntArrayRef shape, Type type) {
  tensors_.push_back({name, shape.vec(), type, offset_});
  offset_ += (encoded_bytes(shape, type) + kAlignment - 1) / kAlignment * kAlignment;
}

void Writer::open(const std::string& path) {
  std::string head = "GGUF";
  put_raw<uint32_t>(head, 3);
  put_raw<uint64_t>(head, tensors_.size());
  put_raw<uint64_t>(head, n_kv_);
  head += kv_;
  for (auto& t : tensors_) {
    put_string(head, t.name);
    put_raw<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put_raw<uint64_t>(head, static_cast<uint64_t>(*d));
    put_raw<uint32_t>(head, static_cast<uint32_t>(t.type));
    put_raw<uint64_t>(head, t.offset);
  }
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  path_ = path;
  tmp_ = path + ".tmp";
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot write " + tmp_);
  out_.write(head.data(), static_cast<std::streamsize>(head.size()));
  offset_ = 0;
}

void Writer::write(const at::Tensor& t) {
  if (next_ >= tensors_.size()) throw std::logic_error("gguf: more tensors written than planned");
  const auto& info = tensors_[next_++];
  if (t.sizes() != at::IntArrayRef(info.shape))
    throw std::logic_error(
        fmt::format("gguf: '{}' planned as {}, written as {}", info.name, c10::str(info.shape), c10::str(t.sizes())));
  uint64_t n = 0;
  if (info.type == Type::Q8_0) {
    const auto bytes = encode(t, info.type);
    out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    n = bytes.size();
  } else {  // straight from the tensor's memory: no second copy of the largest tensor (the embedding)
    const auto x = t.to(info.type == Type::F32 ? at::kFloat : at::kHalf).contiguous();
    out_.write(static_cast<const char*>(x.data_ptr()), static_cast<std::streamsize>(x.nbytes()));
    n = x.nbytes();
  }
  const std::string pad((kAlignment - n % kAlignment) % kAlignment, '\0');
  out_.write(pad.data(), static_cast<std::streamsize>(pad.size()));
  offset_ += n + pad.size();
}

Writer::~Writer() {
  if (tmp_.empty()) return;
  out_.close();
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

void Writer::finish() {
  if (next_ != tensors_.size())
    throw std::logic_error(fmt::format("gguf: {} of {} tensors written", next_, tensors_.size()));
  out_.close();
  if (!out_) throw std::runtime_error("writing " + tmp_ + " failed (disk full?)");
  std::filesystem::rename(tmp_, path_);
  tmp_.clear();
}

}  // namespace mf::gguf
