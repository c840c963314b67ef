// A tokenizer file: SentencePiece `*.model` (ours: BPE with byte fallback, so every byte
// sequence round-trips; or a Hugging Face model's) or a Hugging Face `tokenizer.json`
// (byte-level BPE, see data/hf_tokenizer.h). SentencePiece runs inside a dlopen'ed shim
// (see src/tokenizer_shim/spm_shim.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace mf {

class HfTokenizer;

class Tokenizer {
 public:
  // A path ending in ".json" is read as a Hugging Face tokenizer.json.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  std::vector<int> encode(const std::string& text) const;  // thread-safe
  std::string decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  int eos_id() const;
  int bos_id() const;
  bool is_sentencepiece() const { return hf_ == nullptr; }
  // A SentencePiece model's piece: text, score and type (1 normal, 2 unknown, 3 control, 5 unused, 6 byte).
  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;
  };
  Piece piece(int id) const;

 private:
  void* handle_ = nullptr;           // SentencePiece
  std::unique_ptr<HfTokenizer> hf_;  // or tokenizer.json
};

// The tokenizer file of a directory (checkpoint, prepared corpus, Hugging Face model):
// tokenizer.model, else tokenizer.json; "" when it has neither.
std::string tokenizer_in(const std::string& dir);
// Copies a tokenizer file into `dir` under its own name, with the tokenizer_config.json
// beside a tokenizer.json (it names the special tokens).
void copy_tokenizer(const std::string& tokenizer_file, const std::string& dir);

// Trains on `sample` (one sentence per line) and writes the model to `model_path`.
// Deterministic in (sample, vocab_size). SentencePiece's own log goes to `log_file`.
void train_tokenizer(const std::string& sample, const std::string& model_path, int vocab_size,
                     const std::string& log_file);

}  // namespace mf
