// SentencePiece BPE tokenizer (byte fallback on, so every byte sequence round-trips).
// SentencePiece runs inside a dlopen'ed shim (see src/tokenizer_shim/spm_shim.cpp).
#pragma once
#include <string>
#include <vector>

namespace mf {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  std::vector<int> encode(const std::string& text) const;  // thread-safe
  std::string decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  int eos_id() const;
  int bos_id() const;

 private:
  void* handle_ = nullptr;
};

// Trains on `sample` (one sentence per line) and writes the model to `model_path`.
// Deterministic in (sample, vocab_size). SentencePiece's own log goes to `log_file`.
void train_tokenizer(const std::string& sample, const std::string& model_path, int vocab_size,
                     const std::string& log_file);

}  // namespace mf
