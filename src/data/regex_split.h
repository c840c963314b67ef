// Splits text on a regular expression the way Hugging Face's `Split` pre-tokenizer does
// with behavior "Isolated": every match and every stretch between matches is one piece.
// Patterns are written for Oniguruma (what Hugging Face's library compiles them with) and
// run on PCRE2 in UTF + Unicode-property mode; the one class the two define differently,
// `\s`, is rewritten to Oniguruma's set before compiling, and general-category classes get
// the code points Hugging Face's library assigns but this PCRE2's tables do not.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mf {

class SplitRegex {
 public:
  explicit SplitRegex(const std::string& pattern);
  ~SplitRegex();
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;
  // Appends the pieces of `text` (valid UTF-8) to `out`, in order, none empty. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// A code point's general category ("Lu", ..., "Cn") as Hugging Face's library classes it
// (Oniguruma, Unicode 16.0): utf8proc's (Unicode 15.0 on Debian 12), else the 5,812 code points
// of Unicode 15.1 and 16.0 read from that library (scripts/hf_categories_table.py).
const char* hf_category(char32_t c);

// Oniguruma's `\s` (U+0009-000D, U+0085 and the Z categories) spelled out for PCRE2, whose
// `\s` also takes U+180E; `\p{L}`, `\p{Lo}`, `\d`, ... with the code points of that category
// PCRE2 does not know added as ranges (not for `\P{..}` inside [...]: PCRE2 cannot subtract).
// Throws std::invalid_argument for `\S` inside a bracket class.
std::string oniguruma_to_pcre2(const std::string& pattern);

}  // namespace mf
