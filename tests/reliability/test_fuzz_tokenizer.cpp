// Fuzzing the tokenizer.json implementation. Random Unicode: the real Qwen3 tokenizer (tests/npm;
// NFC normaliser, byte-level BPE) must encode any text within 2 s and decode its ids back to the
// NFC of the text, text with an invalid byte is refused naming the byte and its offset (the
// clear error), and on valid text Qwen3 and DeepSeek-V3 give the ids Hugging Face's own library
// gives. Mutated files: a small tokenizer.json in Qwen3's layout, edited as a hostile user
// would, must load and encode or be refused as a malformed file (FormatError, exit 3).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/util.h"
#include "data/hf_peer.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/safetensors.h"
#include "reliability/fuzz.h"

using namespace mf;
using namespace mf::fuzz;

namespace {

struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Code points from the ranges text brings trouble in: ASCII and controls, combining marks
// (Unicode 10-16 ones included), scripts with and without spaces, emoji with joiners and
// variation selectors, Hangul, letters and digits of Unicode 15-16, unassigned and private-use
// code points, U+FFFD.
char32_t code_point(SplitMix64& rng) {
  static const std::pair<char32_t, char32_t> ranges[] = {
      {0x00, 0x7f},       {0x80, 0x2ff},      {0x300, 0x36f},       {0x7eb, 0x7fd},     {0x1ab0, 0x1aff},
      {0x0600, 0x06ff},   {0x0e00, 0x0e7f},   {0x3040, 0x30ff},     {0x4e00, 0x4fff},   {0xac00, 0xac7f},
      {0x1100, 0x11ff},   {0x200b, 0x200f},   {0xfe00, 0xfe0f},     {0x1f300, 0x1f6ff}, {0x1f900, 0x1faff},
      {0xe000, 0xe0ff},   {0xfff0, 0xfffd},   {0x10fff0, 0x10ffff}, {0x2028, 0x2029},   {0x1e000, 0x1e02f},
      {0x0890, 0x08d3},   {0x1dc0, 0x1dff},   {0x11f00, 0x11f5f},   {0x1e4d0, 0x1e4ff}, {0x31350, 0x31370},
      {0x2ebf0, 0x2ec10}, {0x10d40, 0x10d8f}, {0x1e5d0, 0x1e5ff},   {0x0a70, 0x0a7f},   {0x1100, 0x1112}};
  const auto& [lo, hi] = ranges[rng.below(sizeof(ranges) / sizeof(*ranges))];
  return lo + static_cast<char32_t>(rng.below(hi - lo + 1));
}

std::string random_text(SplitMix64& rng, bool dirty) {
  std::string s;
  const auto n = 1 + rng.below(rng.below(8) == 0 ? 2000 : 60);
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
  const HfTokenizer tok(hf_peer::npm_tokenizer("qwen3"));
  const auto text = [](SplitMix64& rng) { return random_text(rng, rng.below(10) == 0); };  // one in ten dirty
  const auto o = run_cases<Refused>("tokenizer", cases(), text, [&](const std::string& text) {
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

// The same random Unicode (valid only) through Hugging Face's library, in one batch per tokenizer.
TEST(Fuzz, TokenizerMatchesHuggingFaceOnRandomUnicode) {
  const char* seed = std::getenv("MOEFORGE_FUZZ_SEED");
  SplitMix64 rng(0x70c3 ^ static_cast<uint64_t>(seed ? parse_int(seed, "MOEFORGE_FUZZ_SEED") : 0));
  std::vector<json> texts;
  for (int64_t i = 0; i < cases(); ++i) texts.push_back(random_text(rng, false));
  for (const char* name : {"qwen3", "deepseek_v3"}) {
    const auto file = hf_peer::npm_tokenizer(name);
    const HfTokenizer ours(file);
    const auto ref = hf_peer::reference(file, texts, std::string("fuzz_") + name);
    ASSERT_EQ(ref.size(), texts.size());
    size_t differ = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto ids = ours.encode(texts[i].get<std::string>());
      const auto want = ref[i]["ids"].get<std::vector<int>>();
      if (ids == want || ++differ > 3) continue;
      const auto at = std::mismatch(ids.begin(), ids.end(), want.begin(), want.end()).first - ids.begin();
      const auto around = [&](const std::vector<int>& v) {
        return ours.decode(
            std::vector<int>(v.begin() + std::max<long>(0, at - 3), v.begin() + std::min<long>(v.size(), at + 3)));
      };
      ADD_FAILURE() << name << ": ids differ at token " << at << ": ours decode to " << json(around(ids)).dump()
                    << ", Hugging Face's to " << json(around(want)).dump() << ", in " << texts[i].dump();
    }
    std::cout << "[ fuzz ] tokenizer parity, " << name << ": " << texts.size() << " texts, " << differ << " differ\n";
    EXPECT_EQ(differ, 0u);
  }
}

// A small tokenizer.json in Qwen3's layout: its normaliser, split pattern and decoder, the first
// 1,000 tokens, the merges among them and three added tokens.
json small_tokenizer() {
  auto t = json::parse(read_file(hf_peer::npm_tokenizer("qwen3")));
  json vocab = json::object(), merges = json::array(), added = json::array();
  for (auto& [token, id] : t["model"]["vocab"].items())
    if (id.get<int>() < 1000) vocab[token] = id;
  for (auto& m : t["model"]["merges"])
    if (vocab.contains(m[0].get<std::string>() + m[1].get<std::string>())) merges.push_back(m);
  for (int i = 0; i < 3; ++i) {
    added.push_back(t["added_tokens"][i]);
    added.back()["id"] = 1000 + i;
  }
  t["model"]["vocab"] = vocab, t["model"]["merges"] = merges, t["added_tokens"] = added;
  return t;
}

json hostile_text(SplitMix64& rng) {
  static const char* texts[] = {"(",   "[",         "\\p{Nope}",    "(?<=a+)b",  "a{99999999}", "(a*)*b",
                                "",    "\\",        "NFD",          "Lowercase", "Split",       "ByteLevel",
                                "BPE", "WordPiece", "Isolated",     "Removed",   "<unk>",       "\u00C3",
                                "Ġ",   "a b c",     "<|endoftext|>"};
  return texts[rng.below(sizeof(texts) / sizeof(*texts))];
}

std::string mutate_tokenizer(const json& pristine, SplitMix64& rng) {
  if (rng.below(8) == 0) return flip_or_cut(pristine.dump(), rng);
  const auto flat = pristine.flatten();
  std::vector<std::string> paths;
  for (auto& [path, value] : flat.items())
    if (rng.below(20) == 0 || (path.rfind("/model/vocab/", 0) != 0 && path.rfind("/model/merges/", 0) != 0))
      paths.push_back(path);
  const json::json_pointer at(paths[rng.below(paths.size())]);
  auto t = pristine;
  switch (rng.below(4)) {
    case 0: t[at] = weird_value(rng); break;
    case 1: t[at] = hostile_text(rng); break;
    case 2: {
      auto& parent = t[at.parent_pointer()];
      if (parent.is_object())
        parent.erase(at.back());
      else
        parent.erase(std::stoul(at.back()));
      break;
    }
    default: t[at] = static_cast<int64_t>(rng.below(1100)) - 50; break;  // an id or index nearby
  }
  return t.dump();
}

TEST(Fuzz, TokenizerFilesAreUsedOrRefusedClearly) {
  const auto pristine = small_tokenizer();
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("mf_fuzz_tok_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto file = (dir / "tokenizer.json").string();
  write_file_atomic((dir / "tokenizer_config.json").string(), R"({"eos_token": "<|endoftext|>"})");
  write_file_atomic(file, pristine.dump());
  const auto text = "Hello wörld 12345 <|endoftext|>\n\t a\u0301 \U0001F642 \u4E2D\u6587 don't";
  EXPECT_EQ(Tokenizer(file).decode(Tokenizer(file).encode(text)), nfc(text));
  const auto o = run_cases<FormatError>(
      "tokenizer.json", cases() / 10, [&](SplitMix64& rng) { return mutate_tokenizer(pristine, rng); },
      [&](const std::string& mutated) {
        write_file_atomic(file, mutated);
        const Tokenizer tok(file);
        tok.decode(tok.encode(text));
      });
  expect_only_success_or_clear(o);
  std::filesystem::remove_all(dir);
}

}  // namespace
