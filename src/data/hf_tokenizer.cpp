#include "data/hf_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/util.h"
#include "data/unicode.h"

namespace mf {
namespace {

using json = nlohmann::json;

// GPT-2's split, which ByteLevel applies itself when `use_regex` is true.
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Runs read(), naming `where` (the key path it reads) in any JSON type or range error.
template <class Read>
auto keyed(const std::string& where, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const json::exception& e) {
    const std::string what = e.what();  // "[json.exception.type_error.302] type must be ..."
    const auto tag = what.find("] ");
    throw std::invalid_argument(fmt::format("{}: {}", where, tag == std::string::npos ? what : what.substr(tag + 2)));
  }
}

std::string type_of(const json& j, const std::string& where) {
  return j.is_object() && j.contains("type") ? keyed(where + ".type", [&] { return j["type"].get<std::string>(); })
                                             : "";
}

// A flag that must hold the given value for the behaviour we implement.
void require(const std::string& where, const json& j, const char* key, const json& expected) {
  if (j.contains(key) && !j[key].is_null() && j[key] != expected)
    throw std::invalid_argument(
        fmt::format("{}: {} = {} is not supported (only {})", where, key, j[key].dump(), expected.dump()));
}

json read_json(const std::string& path) {
  const auto text = read_file(path);
  if (json_depth(text) > kMaxJsonDepth)
    throw std::invalid_argument(fmt::format("{}: JSON nests deeper than {} levels", path, kMaxJsonDepth));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

// A token id as the file gives it: an integer in [0, kMaxTokenId]; nlohmann's get<int>() would
// turn 5.5 into 5 and 2^40 into 0, and a huge id would size the token table.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
int token_id(const json& v, const std::string& where) {
  const bool integer = v.is_number_integer();
  if (!integer || (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)
                                          : v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId))
    throw std::invalid_argument(fmt::format("{}: id {} is not an integer in 0..{}", where, v.dump(), kMaxTokenId));
  return static_cast<int>(v.get<int64_t>());
}

std::string quote_regex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// One merge, as "a b" or ["a", "b"].
std::pair<std::string, std::string> read_merge(const json& m, size_t index) {
  const auto where = fmt::format("model.merges[{}]", index);
  if (m.is_array() && m.size() == 2)
    return keyed(where, [&] { return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>()); });
  const auto s = keyed(where, [&] { return m.get<std::string>(); });
  const auto space = s.find(' ');
  if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
    throw std::invalid_argument(fmt::format("{}: '{}' is not two tokens separated by one space", where, s));
  return {s.substr(0, space), s.substr(space + 1)};
}

}  // namespace

void HfTokenizer::AddedSet::index() {
  for (int i = 0; i < static_cast<int>(tokens.size()); ++i)
    if (!tokens[i].content.empty()) by_byte[static_cast<unsigned char>(tokens[i].content[0])].push_back(i);
  for (auto& bucket : by_byte)  // longest first: the first hit at a position is the longest
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](int a, int b) { return tokens[a].content.size() > tokens[b].content.size(); });
}

HfTokenizer::HfTokenizer(const std::string& path) : path_(path) {
  const json j = read_json(path);
  try {
    const auto& model = j.at("model");
    if (type_of(model, "model") != "BPE")
      throw std::invalid_argument(fmt::format("model.type '{}' is not supported (only BPE)", type_of(model, "model")));
    const std::string where = path + " model";
    require(where, model, "dropout", nullptr);
    require(where, model, "byte_fallback", false);
    require(where, model, "continuing_subword_prefix", "");
    require(where, model, "end_of_word_suffix", "");
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(model.at("merges").size());
    for (const auto& m : model.at("merges")) merges.push_back(read_merge(m, merges.size()));
    std::unordered_map<std::string, int> vocab;
    for (const auto& [token, value] : model.at("vocab").items()) {
      const int id = token_id(value, fmt::format("model.vocab '{}'", token));
      if (id >= static_cast<int>(tokens_.size())) tokens_.resize(id + 1);
      tokens_[id] = token;
      vocab[token] = id;
    }
    const bool ignore_merges = keyed("model.ignore_merges", [&] { return model.value("ignore_merges", false); });
    bpe_ = std::make_unique<Bpe>(std::move(vocab), merges, ignore_merges);
    read_normalizer(j.value("normalizer", json()), "normalizer");
    read_pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer");
    if (!byte_level_)
      throw std::invalid_argument("pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    read_added(j.value("added_tokens", json::array()));
    const auto decoder = type_of(j.value("decoder", json()), "decoder");
    if (decoder != "ByteLevel")
      throw std::invalid_argument(fmt::format("decoder.type '{}' is not supported (only ByteLevel)", decoder));
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind(path, 0) == 0) throw;
    throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
  read_config((std::filesystem::path(path).parent_path() / "tokenizer_config.json").string());
}

void HfTokenizer::read_normalizer(const nlohmann::json& j, const std::string& where) {
  const auto type = type_of(j, where);
  if (j.is_null()) return;
  if (type == "Sequence") {
    const auto& list = keyed(where, [&]() -> const json& { return j.at("normalizers"); });
    for (size_t i = 0; i < list.size(); ++i) read_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
  } else if (type == "NFC") {
    normalizers_.push_back(Normalizer::kNfc);
  } else if (type == "NFKC") {
    normalizers_.push_back(Normalizer::kNfkc);
  } else {
    throw std::invalid_argument(
        fmt::format("{}: type '{}' is not supported (NFC, NFKC, Sequence)", where, type.empty() ? j.dump() : type));
  }
}

void HfTokenizer::read_pre_tokenizer(const nlohmann::json& j, const std::string& where) {
  const auto type = type_of(j, where);
  if (byte_level_ && type != "Sequence") throw std::invalid_argument(where + ": ByteLevel must come last");
  if (type == "Sequence") {
    const auto& list = keyed(where, [&]() -> const json& { return j.at("pretokenizers"); });
    for (size_t i = 0; i < list.size(); ++i) read_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
  } else if (type == "Split") {
    require(where, j, "behavior", "Isolated");
    require(where, j, "invert", false);
    splits_.emplace_back(keyed(where + ".pattern", [&] {
      const auto& pattern = j.at("pattern");
      return pattern.contains("Regex") ? pattern["Regex"].get<std::string>()
                                       : quote_regex(pattern.at("String").get<std::string>());
    }));
  } else if (type == "ByteLevel") {
    keyed(where, [&] {
      if (j.value("use_regex", true)) splits_.emplace_back(kGpt2Pattern);
      prefix_space_ = j.value("add_prefix_space", false);
    });
    byte_level_ = true;
  } else {
    throw std::invalid_argument(fmt::format("{}: type '{}' is not supported (Split, ByteLevel, Sequence)", where,
                                            type.empty() ? j.dump() : type));
  }
}

void HfTokenizer::read_added(const nlohmann::json& j) {
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& a = j[i];
    const auto at = fmt::format("added_tokens[{}]", i);
    const auto content = keyed(at + ".content", [&] { return a.at("content").get<std::string>(); });
    const std::string where = fmt::format("added_tokens '{}'", content);
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) require(where, a, flag, false);
    Added token{content, keyed(at + ".id", [&] { return token_id(a.at("id"), where); }),
                keyed(at + ".special", [&] { return a.value("special", false); })};
    if (token.id >= static_cast<int>(tokens_.size())) tokens_.resize(token.id + 1);
    tokens_[token.id] = token.content;
    special_.resize(tokens_.size());
    special_[token.id] = token.special;
    // Hugging Face matches normalised added tokens in the normalised text, so their content is normalised too.
    if (keyed(at + ".normalized", [&] { return a.value("normalized", !token.special); })) {
      token.content = normalise(token.content);
      normalised_added_.tokens.push_back(std::move(token));
    } else {
      raw_added_.tokens.push_back(std::move(token));
    }
  }
  special_.resize(tokens_.size());
  raw_added_.index();
  normalised_added_.index();
}

void HfTokenizer::read_config(const std::string& config_path) {
  if (!std::filesystem::is_regular_file(config_path)) return;
  const json c = read_json(config_path);
  const auto id_of = [&](const char* key) {
    if (!c.contains(key) || c[key].is_null()) return -1;
    std::string content;
    try {
      content = c[key].is_string() ? c[key].get<std::string>() : c[key].at("content").get<std::string>();
    } catch (const json::exception& e) {
      throw std::invalid_argument(fmt::format("{}: {}: {}", config_path, key, e.what()));
    }
    for (int i = 0; i < static_cast<int>(tokens_.size()); ++i)
      if (tokens_[i] == content) return i;
    throw std::invalid_argument(fmt::format("{}: {} '{}' is not a token of {}", config_path, key, content, path_));
  };
  eos_ = id_of("eos_token");
  bos_ = id_of("bos_token");
}

std::string HfTokenizer::normalise(std::string_view text) const {
  std::string out(text);
  for (auto n : normalizers_) out = n == Normalizer::kNfc ? nfc(out) : nfkc(out);
  return out;
}

// Calls emit(piece, id) for each stretch of `text`: id >= 0 for an added token, -1 for
// plain text between them. Leftmost match wins, then the longest at that position.
template <class Emit>
void HfTokenizer::split_added(std::string_view text, const AddedSet& set, Emit&& emit) const {
  size_t plain = 0;
  for (size_t at = 0; at < text.size();) {
    const Added* hit = nullptr;
    for (int i : set.by_byte[static_cast<unsigned char>(text[at])]) {
      const auto& t = set.tokens[i];
      if (text.compare(at, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++at;
      continue;
    }
    if (at > plain) emit(text.substr(plain, at - plain), -1);
    emit(text.substr(at, hit->content.size()), hit->id);
    plain = at += hit->content.size();
  }
  if (plain < text.size()) emit(text.substr(plain), -1);
}

void HfTokenizer::encode_plain(std::string_view text, std::vector<int>& out) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& regex : splits_) {
    next.clear();
    for (auto p : pieces) regex.split(p, next);
    pieces.swap(next);
  }
  std::string prefixed;
  for (auto p : pieces) {
    if (prefix_space_ && p.front() != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(p);
      p = prefixed;
    }
    bpe_->encode(p, out);
  }
}

std::vector<int> HfTokenizer::encode(std::string_view text) const {
  require_utf8(text, "text to encode");
  std::vector<int> out;
  split_added(text, raw_added_, [&](std::string_view raw, int id) {
    if (id >= 0) return out.push_back(id);
    const auto normalised = normalise(raw);
    split_added(normalised, normalised_added_, [&](std::string_view piece, int added) {
      if (added >= 0) return out.push_back(added);
      encode_plain(piece, out);
    });
  });
  return out;
}

const std::string& HfTokenizer::token(int id) const {
  if (id < 0 || id >= vocab_size() || tokens_[id].empty())
    throw std::out_of_range(fmt::format("token id {} is not in {} ({} ids)", id, path_, vocab_size()));
  return tokens_[id];
}

// ByteLevel decoding: each token's characters map back to bytes; a token with a character
// outside the byte-level alphabet (an added token such as DeepSeek's) is kept as written.
std::string HfTokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
  std::string bytes, token_bytes;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size() || tokens_[id].empty()) continue;  // as Hugging Face: ids without a token vanish
    const auto& t = tokens_[id];
    if (skip_special && special_[id]) continue;
    token_bytes.clear();
    for (size_t i = 0; i < t.size();) {
      const int b = char_byte(next_code_point(t, i));
      if (b < 0) {
        token_bytes = t;
        break;
      }
      token_bytes += static_cast<char>(b);
    }
    bytes += token_bytes;
  }
  return utf8_lossy(bytes);
}

}  // namespace mf
