// Hugging Face `tokenizer.json` with a byte-level BPE model (GPT-2, Qwen2/3, OLMoE,
// DeepSeek, Llama 3): added tokens -> normaliser -> pre-tokenizer splits -> byte-level
// alphabet -> BPE by merge rank; decode maps the byte-level characters back to bytes.
// `encode` is Hugging Face's `encode(text, add_special_tokens=False)`: the post-processor
// adds nothing. Components it does not implement are refused by name at load time.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/bpe.h"
#include "data/regex_split.h"

namespace mf {

class HfTokenizer {
 public:
  // Reads `path` (tokenizer.json) and, when present, tokenizer_config.json beside it
  // (bos_token, eos_token). Throws std::invalid_argument naming the file and the key.
  explicit HfTokenizer(const std::string& path);
  // `text` must be valid UTF-8 (std::invalid_argument with the byte offset otherwise).
  std::vector<int> encode(std::string_view text) const;
  // Bytes that are not valid UTF-8 become U+FFFD and ids without a token (a model's padded
  // vocabulary rows) are skipped, as in Hugging Face's decoder.
  std::string decode(const std::vector<int>& ids, bool skip_special = false) const;
  const std::string& token(int id) const;  // the vocabulary string (byte-level alphabet)
  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  int eos_id() const { return eos_; }
  int bos_id() const { return bos_; }

 private:
  struct Added {
    std::string content;
    int id;
    bool special;
  };
  // Added tokens matched leftmost-longest, bucketed by first byte.
  struct AddedSet {
    std::vector<Added> tokens;
    std::vector<std::vector<int>> by_byte = std::vector<std::vector<int>>(256);
    void index();
  };
  enum class Normalizer { kNfc, kNfkc };
  void read_normalizer(const nlohmann::json& j, const std::string& where);
  void read_pre_tokenizer(const nlohmann::json& j, const std::string& where);
  void read_added(const nlohmann::json& j);
  void read_config(const std::string& config_path);
  template <class Emit>
  void split_added(std::string_view text, const AddedSet& set, Emit&& emit) const;
  std::string normalise(std::string_view text) const;
  void encode_plain(std::string_view text, std::vector<int>& out) const;

  std::string path_;
  std::vector<Normalizer> normalizers_;
  std::vector<SplitRegex> splits_;
  bool prefix_space_ = false;  // ByteLevel add_prefix_space
  bool byte_level_ = false;
  std::unique_ptr<Bpe> bpe_;
  AddedSet raw_added_, normalised_added_;  // matched before / after the normaliser
  std::vector<std::string> tokens_;        // id -> string (model vocabulary and added tokens)
  std::vector<char> special_;              // id -> is a special added token
  int eos_ = -1, bos_ = -1;
};

}  // namespace mf
