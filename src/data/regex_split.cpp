#include "data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <stdexcept>

namespace mf {

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
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  const auto translated = oniguruma_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::invalid_argument(fmt::format("regex '{}' does not compile at offset {}: {}", pattern, offset,
                                            reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
}

SplitRegex::~SplitRegex() = default;
SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& out) const {
  struct MatchData {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(data); }
  };
  thread_local MatchData match;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t piece = 0, at = 0;
  while (at <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error(fmt::format("regex match failed with PCRE2 error {}", rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.data);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match splits nothing; step over one character
      at = end + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (start > piece) out.push_back(text.substr(piece, start - piece));
    out.push_back(text.substr(start, end - start));
    piece = at = end;
  }
  if (piece < text.size()) out.push_back(text.substr(piece));
}

}  // namespace mf
