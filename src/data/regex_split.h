// Splits text on a regular expression the way Hugging Face's `Split` pre-tokenizer does
// with behavior "Isolated": every match and every stretch between matches is one piece.
// Patterns are written for Oniguruma (what Hugging Face's library compiles them with) and
// run on PCRE2 in UTF + Unicode-property mode; the one class the two define differently,
// `\s`, is rewritten to Oniguruma's set before compiling.
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

// Oniguruma's `\s` (U+0009-000D, U+0085 and the Z categories) spelled out for PCRE2, whose
// `\s` also takes U+180E. Throws std::invalid_argument for `\S` inside a bracket class.
std::string oniguruma_to_pcre2(const std::string& pattern);

}  // namespace mf
