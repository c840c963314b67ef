#include "data/unicode.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace mf {
namespace {

// Length of the valid sequence starting at s[i], or 0 with `bad` = how many bytes form
// the maximal invalid subpart (Unicode's "best practice", which Rust also follows).
size_t valid_length(std::string_view s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char x = b(i + k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return 0;
    bad = k + 1;
  }
  return n;
}

std::string normalise(std::string_view s, utf8proc_option_t options) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, options);
  if (n < 0) throw std::invalid_argument(fmt::format("unicode normalisation failed: {}", utf8proc_errmsg(n)));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace

size_t invalid_utf8_at(std::string_view s) {
  size_t bad;
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_length(s, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, const std::string& what) {
  const size_t at = invalid_utf8_at(s);
  if (at != std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("{} is not valid UTF-8: byte 0x{:02X} at offset {}", what, static_cast<unsigned char>(s[at]), at));
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t bad;
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_length(s, i, bad);
    if (n > 0)
      out.append(s.substr(i, n)), i += n;
    else
      out += "\xEF\xBF\xBD", i += bad;
  }
  return out;
}

std::string nfc(std::string_view s) {
  return normalise(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
}
std::string nfkc(std::string_view s) {
  return normalise(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
}

void append_utf8(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

char32_t next_code_point(std::string_view s, size_t& i) {
  utf8proc_int32_t c = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &c);
  i += n > 0 ? static_cast<size_t>(n) : 1;
  return static_cast<char32_t>(c);
}

namespace {
struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<char32_t, 256> code;
  std::array<int, 256 + 68> byte;  // code point -> byte, -1 for characters that stand for none
  ByteMap() {
    byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      code[b] = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(chars[b], code[b]);
      byte[code[b]] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::array<std::string, 256>& byte_chars() { return byte_map().chars; }

int char_byte(char32_t c) { return c < byte_map().byte.size() ? byte_map().byte[c] : -1; }

}  // namespace mf
