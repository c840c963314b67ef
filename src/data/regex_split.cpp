#include "data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "data/unicode.h"

namespace mf {

namespace {

pcre2_code* compile(const std::string& translated, const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), PCRE2_UTF | PCRE2_UCP,
                             &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::invalid_argument(fmt::format("regex '{}' does not compile at offset {}: {}", pattern, offset,
                                            reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  return code;
}

// Calls found(start, end) for each non-empty match of `code` in `text`, left to right.
template <class Found>
void each_match(const pcre2_code* code, std::string_view text, Found&& found) {
  struct MatchData {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(data); }
  };
  thread_local MatchData match;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error(fmt::format("regex match failed with PCRE2 error {}", rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.data);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match splits nothing; step over one character
      at = end + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    found(start, end);
    at = end;
  }
}

struct Span {
  char32_t first, last;
  const char* category;  // two letters
};

// Hugging Face's categories of the code points utf8proc leaves unassigned (Unicode 15.1, 16.0).
constexpr Span kHfOnly[] = {
#include "data/unicode16.inc"
};

// The code points Hugging Face's library assigns (Oniguruma with Unicode 16.0 tables) that
// this PCRE2 classes as unassigned (Debian 12's PCRE2 10.42 has Unicode 14.0), with their
// general category: found once per process by matching \p{Cn} over every assigned code point.
const std::vector<Span>& unknown_to_pcre2() {
  static const std::vector<Span> spans = [] {
    std::string text;
    for (char32_t c = 1; c <= 0x10FFFF; ++c) {
      const std::string_view category = hf_category(c);
      if (category != "Cn" && category != "Cs" && category != "Co") append_utf8(text, c);
    }
    std::vector<Span> out;
    const std::string pattern = R"(\p{Cn})";
    const std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> unassigned(compile(pattern, pattern),
                                                                             &pcre2_code_free);
    each_match(unassigned.get(), text, [&](size_t start, size_t) {
      const char32_t c = next_code_point(text, start);
      const char* category = hf_category(c);
      if (!out.empty() && out.back().last + 1 == c && std::string_view(out.back().category) == category)
        out.back().last = c;
      else
        out.push_back({c, c, category});
    });
    return out;
  }();
  return spans;
}

// The code points of general category `name` ("L", "Lo", ...) that PCRE2 does not know, as
// class ranges; empty for other property names.
std::string unknown_ranges(std::string_view name) {
  std::string out;
  if (name.empty() || name.size() > 2) return out;
  for (const auto& s : unknown_to_pcre2())
    if (std::string_view(s.category).substr(0, name.size()) == name)
      out += fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", static_cast<uint32_t>(s.first), static_cast<uint32_t>(s.last));
  return out;
}

// `\p{name}` / `\P{name}` / `\p{^name}` / `\d` / `\D` with the code points of that category
// PCRE2 does not know added. A negated one inside [...] is kept as written (PCRE2 has no
// class subtraction), so there those code points stay unassigned.
std::string property(const std::string& p, size_t& i, bool in_class) {
  const char e = p[i];
  std::string name = "Nd", written = "\\d";
  bool negated = e == 'D';
  if (e == 'p' || e == 'P') {
    const auto close = p.find('}', i);
    if (i + 1 >= p.size() || p[i + 1] != '{' || close == std::string::npos) return written;
    name = p.substr(i + 2, close - i - 2);
    negated = (e == 'P') != (!name.empty() && name[0] == '^');
    if (!name.empty() && name[0] == '^') name.erase(0, 1);
    written = fmt::format("\\p{{{}}}", name);
    i = close;
  }
  const auto extra = unknown_ranges(name);
  if (extra.empty() || (negated && in_class)) return negated ? "\\P{" + name + "}" : written;
  if (in_class) return written + extra;
  return (negated ? "[^" : "[") + written + extra + "]";
}

}  // namespace

const char* hf_category(char32_t c) {
  if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_CN)
    return utf8proc_category_string(static_cast<utf8proc_int32_t>(c));
  const auto* at =
      std::lower_bound(std::begin(kHfOnly), std::end(kHfOnly), c, [](const Span& s, char32_t x) { return s.last < x; });
  return at != std::end(kHfOnly) && at->first <= c ? at->category : "Cn";
}

std::string oniguruma_to_pcre2(const std::string& p) {
  static const std::string space = R"(\x09-\x0D\x{85}\p{Z})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's')
        out += in_class ? space : "[" + space + "]";
      else if (e == 'S' && !in_class)
        out += "[^" + space + "]";
      else if (e == 'S')
        throw std::invalid_argument(fmt::format("regex '{}': \\S inside [...] is not supported", p));
      else if (e == 'p' || e == 'P' || e == 'd' || e == 'D')
        out += property(p, i, in_class);
      else
        out += c, out += e;
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

struct SplitRegex::Compiled {
  explicit Compiled(pcre2_code* c) : code(c) {}
  Compiled(const Compiled&) = delete;
  Compiled& operator=(const Compiled&) = delete;
  ~Compiled() { pcre2_code_free(code); }
  pcre2_code* code;
};

SplitRegex::SplitRegex(const std::string& pattern)
    : compiled_(std::make_unique<Compiled>(compile(oniguruma_to_pcre2(pattern), pattern))) {}

SplitRegex::~SplitRegex() = default;
SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& out) const {
  size_t piece = 0;
  each_match(compiled_->code, text, [&](size_t start, size_t end) {
    if (start > piece) out.push_back(text.substr(piece, start - piece));
    out.push_back(text.substr(start, end - start));
    piece = end;
  });
  if (piece < text.size()) out.push_back(text.substr(piece));
}

}  // namespace mf
