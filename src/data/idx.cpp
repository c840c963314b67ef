#include "data/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace mf {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using Gz = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

bool starts_with_gzip_magic(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw DataError(fmt::format("{}: cannot open", path));
  unsigned char m[2] = {0, 0};
  return std::fread(m, 1, 2, f.get()) == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

// Reads exactly n bytes or reports how many it got.
int64_t read_all(gzFile f, void* out, int64_t n, const std::string& path) {
  int64_t got = 0;
  auto* p = static_cast<unsigned char*>(out);
  while (got < n) {
    const int chunk = static_cast<int>(std::min<int64_t>(n - got, 1 << 30));
    const int r = gzread(f, p + got, static_cast<unsigned>(chunk));
    if (r < 0) {
      int err = 0;
      throw DataError(fmt::format("{}: corrupt gzip data ({})", path, gzerror(f, &err)));
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

}  // namespace

at::Tensor read_idx_gz(const std::string& path, int64_t dims) {
  if (!starts_with_gzip_magic(path)) throw DataError(fmt::format("{}: not a gzip file", path));
  Gz f(gzopen(path.c_str(), "rb"));
  if (!f) throw DataError(fmt::format("{}: cannot open", path));
  unsigned char head[4];
  if (read_all(f.get(), head, 4, path) != 4) throw DataError(fmt::format("{}: truncated IDX header", path));
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != dims)
    throw DataError(
        fmt::format("{}: IDX magic {:02x}{:02x}{:02x}{:02x}, expected 000008{:02x} (unsigned bytes, {} "
                    "dimensions)",
                    path, head[0], head[1], head[2], head[3], dims, dims));
  std::vector<int64_t> sizes;
  int64_t total = 1;
  for (int64_t i = 0; i < dims; ++i) {
    unsigned char b[4];
    if (read_all(f.get(), b, 4, path) != 4) throw DataError(fmt::format("{}: truncated IDX header", path));
    const int64_t n = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    if (n <= 0 || n > (int64_t{1} << 28)) throw DataError(fmt::format("{}: dimension {} has size {}", path, i, n));
    sizes.push_back(n);
    total *= n;
    if (total > (int64_t{1} << 33)) throw DataError(fmt::format("{}: {} bytes is too large", path, total));
  }
  auto out = at::empty(sizes, at::kByte);
  const int64_t got = read_all(f.get(), out.data_ptr<uint8_t>(), total, path);
  if (got != total) throw DataError(fmt::format("{}: truncated: {} of {} payload bytes", path, got, total));
  unsigned char extra;
  if (read_all(f.get(), &extra, 1, path) != 0) throw DataError(fmt::format("{}: bytes after the IDX payload", path));
  return out;
}

void write_idx_gz(const std::string& path, const at::Tensor& data) {
  auto t = data.to(at::kByte).contiguous();
  Gz f(gzopen(path.c_str(), "wb"));
  if (!f) throw DataError(fmt::format("{}: cannot write", path));
  std::vector<unsigned char> head = {0, 0, 0x08, static_cast<unsigned char>(t.dim())};
  for (auto n : t.sizes())
    for (int shift : {24, 16, 8, 0}) head.push_back(static_cast<unsigned char>((n >> shift) & 0xff));
  gzwrite(f.get(), head.data(), static_cast<unsigned>(head.size()));
  if (t.numel() > 0) gzwrite(f.get(), t.data_ptr<uint8_t>(), static_cast<unsigned>(t.numel()));
}

}  // namespace mf
