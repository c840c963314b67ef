// GGUF files (llama.cpp's model format, version 3), written as a stream: the metadata and the
// tensor table first (names, shapes, types, offsets), then each tensor's bytes in table order,
// so one tensor is in memory at a time. Written to a temporary name and renamed at the end.
//
// Layout: "GGUF" u32 version u64 n_tensors u64 n_kv, the key-values (string key, u32 type,
// value), the tensor infos (string name, u32 n_dims, u64 ne[n_dims] innermost first, u32 type,
// u64 offset from the data start), padding to `general.alignment` (32), the data.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace mf::gguf {

enum class Type : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8 };  // ggml_type
const char* type_name(Type t);
constexpr int64_t kQ8Block = 32;  // q8_0: 32 int8 values and one f16 scale (34 bytes)

// Bytes of `t` (float32, the innermost dimension contiguous) stored as `type`; q8_0 needs the
// innermost size to be a multiple of 32. q8_0 scale d = max|x| / 127, values round(x / d).
std::string encode(const at::Tensor& t, Type type);
int64_t encoded_bytes(at::IntArrayRef shape, Type type);
// The inverse, for tests and for reading a file back: float32 of `shape`.
at::Tensor decode(const std::string& bytes, at::IntArrayRef shape, Type type);

class Writer {
 public:
  static constexpr uint64_t kAlignment = 32;
  Writer() = default;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();  // an unfinished file's temporary is removed
  void set(const std::string& key, uint32_t v);
  void set(const std::string& key, float v);
  void set(const std::string& key, bool v);
  void set(const std::string& key, const std::string& v);
  void set(const std::string& key, const char* v) { set(key, std::string(v)); }
  void set(const std::string& key, const std::vector<std::string>& v);
  void set(const std::string& key, const std::vector<float>& v);
  void set(const std::string& key, const std::vector<int32_t>& v);
  // `shape` in LibTorch order (outermost first); stored innermost first as GGUF wants.
  void add_tensor(const std::string& name, at::IntArrayRef shape, Type type);
  // Writes the header; then write() each planned tensor in order, then finish().
  void open(const std::string& path);
  void write(const at::Tensor& t);  // float32 of the planned shape
  void finish();
  int64_t bytes() const { return offset_; }  // tensor data so far

 private:
  struct Info {
    std::string name;
    std::vector<int64_t> shape;
    Type type;
    uint64_t offset;
  };
  void key(const std::string& k, uint32_t value_type);
  std::string kv_;
  uint64_t n_kv_ = 0, offset_ = 0;
  std::vector<Info> tensors_;
  size_t next_ = 0;
  std::string path_, tmp_;
  std::ofstream out_;
};

// A GGUF file read back (metadata as text, tensors decoded): what tests check a file with.
struct File {
  std::vector<std::pair<std::string, std::string>> metadata;  // key, value as JSON text
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;  // LibTorch order
    Type type;
    at::Tensor value;  // float32
  };
  std::vector<Tensor> tensors;
  std::string value(const std::string& key) const;  // "" if absent
  const Tensor& tensor(const std::string& name) const;
};
File read(const std::string& path);

}  // namespace mf::gguf
