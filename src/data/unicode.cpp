#include "data/unicode.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
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

struct Newer {
  char32_t first, last;
  bool canonical;
};
constexpr Newer kNewer[] = {
#include "data/unicode9.inc"
};

// Whether c is one of the code points Unicode assigned after 9.0 that this normalisation
// would touch (compat: NFKC, else NFC).
bool newer_than_unicode9(char32_t c, bool compat) {
  const auto* at =
      std::lower_bound(std::begin(kNewer), std::end(kNewer), c, [](const Newer& n, char32_t x) { return n.last < x; });
  return at != std::end(kNewer) && at->first <= c && (compat || at->canonical);
}

// U+11A7 is not a trailing consonant (those start at U+11A8), so it never joins a syllable, but
// utf8proc 2.8 composes "가" + U+11A7 into "가", dropping it. Kept as it is, like the above.
constexpr char32_t kJungseongOYae = 0x11A7;

// Unassigned code points are starters that neither decompose nor compose, and canonical
// reordering never moves a mark across a starter, so normalising as Unicode 9.0 did is
// normalising each stretch between such code points on its own and keeping them as they are.
std::string normalise_unicode9(std::string_view s, utf8proc_option_t options) {
  const bool compat = options & UTF8PROC_COMPAT;
  std::string out;
  size_t stretch = 0;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0xDF) {  // ASCII, a continuation byte or a lead below U+07C0
      ++i;
      continue;
    }
    const size_t at = i;
    const char32_t c = next_code_point(s, i);
    if (!newer_than_unicode9(c, compat) && c != kJungseongOYae) continue;
    out += normalise(s.substr(stretch, at - stretch), options);
    out.append(s.substr(at, i - at));
    stretch = i;
  }
  if (stretch == 0) return normalise(s, options);
  return out + normalise(s.substr(stretch), options);
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
  return normalise_unicode9(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
}
std::string nfkc(std::string_view s) {
  return normalise_unicode9(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
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
