// The tokenizer as llama.cpp reads it from tokenizer.ggml.*: a SentencePiece model as "llama"
// (pieces, scores, token types), a byte-level BPE tokenizer.json as "gpt2" (tokens in the
// byte-level alphabet, merges, and the pre-tokenizer's name, which selects llama.cpp's own
// copy of the split regexes). Ids the model has beyond the tokenizer's are "[PAD<id>]", unused.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/util.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "io/gguf/vocab.h"
#include "io/safetensors.h"  // FormatError

namespace mf::gguf {
namespace {

enum TokenType : int32_t { kNormal = 1, kUnused = 5, kControl = 3, kUserDefined = 4 };

// llama.cpp's pre-tokenizer names and the Split regexes of the tokenizer.json files they stand for.
const std::vector<std::pair<std::string, std::vector<std::string>>>& known_splits() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> known = {
      {"qwen2",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"deepseek-v3",
       {R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
  };
  return known;
}

std::vector<std::string> split_patterns(const nlohmann::json& pre) {
  std::vector<std::string> out;
  const auto visit = [&](const nlohmann::json& p) {
    if (p.value("type", "") == "Split" && p.contains("pattern") && p["pattern"].contains("Regex"))
      out.push_back(p["pattern"]["Regex"].get<std::string>());
  };
  if (pre.is_object() && pre.value("type", "") == "Sequence")
    for (auto& p : pre["pretokenizers"]) visit(p);
  else if (pre.is_object())
    visit(pre);
  return out;
}

std::string pre_name(const nlohmann::json& pre, const std::string& file) {
  const auto patterns = split_patterns(pre);
  for (auto& [name, splits] : known_splits())
    if (patterns == splits) return name;
  throw ConfigError(fmt::format(
      "{}: pre_tokenizer splits by {}; llama.cpp needs the name of its own copy of those regexes and this exporter "
      "knows Qwen2/Qwen3's (\"qwen2\") and DeepSeek-V3's (\"deepseek-v3\")",
      file, nlohmann::json(patterns).dump()));
}

void write_bpe(Writer& w, const std::string& file, int64_t vocab) {
  const auto j = read_json_file(file);
  const auto& model = j.at("model");
  std::vector<std::string> tokens(vocab);
  std::vector<int32_t> types(vocab, kNormal);
  const auto place = [&](const std::string& text, int64_t id, int32_t type) {
    if (id < 0 || id >= vocab)
      throw ConfigError(
          fmt::format("{}: token id {} ('{}') is outside the model's vocabulary of {}", file, id, text, vocab));
    tokens[id] = text, types[id] = type;
  };
  for (auto& [text, id] : model.at("vocab").items()) place(text, id.get<int64_t>(), kNormal);
  for (auto& t : j.value("added_tokens", nlohmann::json::array()))
    place(t.at("content"), t.at("id").get<int64_t>(), t.value("special", false) ? kControl : kUserDefined);
  for (int64_t i = 0; i < vocab; ++i)
    if (tokens[i].empty()) tokens[i] = fmt::format("[PAD{}]", i), types[i] = kUnused;
  std::vector<std::string> merges;
  for (auto& m : model.at("merges"))
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", pre_name(j.value("pre_tokenizer", nlohmann::json()), file));
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", merges);
  const HfTokenizer tok(file);
  if (tok.bos_id() >= 0) w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id()));
  if (tok.eos_id() >= 0) w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id()));
  w.set("tokenizer.ggml.add_bos_token", false);  // encode(text) adds no special tokens
}

void write_spm(Writer& w, const Tokenizer& tok, int64_t vocab) {
  std::vector<std::string> tokens(vocab);
  std::vector<float> scores(vocab, 0.0f);
  std::vector<int32_t> types(vocab, kUnused);
  for (int id = 0; id < tok.vocab_size(); ++id) {
    auto p = tok.piece(id);
    tokens[id] = std::move(p.text), scores[id] = p.score, types[id] = p.type;
  }
  for (int64_t i = tok.vocab_size(); i < vocab; ++i) tokens[i] = fmt::format("[PAD{}]", i);
  const auto a = tok.encode("a");
  const bool dummy_prefix = !a.empty() && tok.piece(a[0]).text.rfind("\u2581", 0) == 0;
  w.set("tokenizer.ggml.model", "llama");
  w.set("tokenizer.ggml.pre", "default");
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.scores", scores);
  w.set("tokenizer.ggml.token_type", types);
  if (tok.bos_id() >= 0) w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id()));
  if (tok.eos_id() >= 0) w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id()));
  w.set("tokenizer.ggml.add_bos_token", false);  // our prompts carry no BOS
  w.set("tokenizer.ggml.add_space_prefix", dummy_prefix);
}

}  // namespace

void write_vocab(Writer& w, const std::string& file, int64_t vocab) {
  const Tokenizer tok(file);
  if (tok.vocab_size() > vocab)
    throw ConfigError(
        fmt::format("{}: {} tokens, more than the model's vocabulary of {}", file, tok.vocab_size(), vocab));
  if (tok.is_sentencepiece())
    write_spm(w, tok, vocab);
  else
    write_bpe(w, file, vocab);
}

}  // namespace mf::gguf
