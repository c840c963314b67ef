#include "data/unicode.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "core/util.h"

namespace mf {
namespace {

std::string normalise(std::string_view s, utf8proc_option_t options) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, options);
  if (n < 0) throw std::invalid_argument(fmt::format("unicode normalisation failed: {}", utf8proc_errmsg(n)));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t bad;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i, bad);
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
