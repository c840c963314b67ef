// Byte-pair encoding by merge rank, on the bytes of one pre-tokenized piece.
// Legend: a "symbol" is a token id; the pieces start as one symbol per byte (through the
// byte-level alphabet) and the lowest-ranked adjacent pair is merged until none is left.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mf {

class Bpe {
 public:
  // `vocab`: token string -> id; `merges`: pairs of token strings, rank = index.
  // Every byte must have its byte-level character in the vocabulary, and every merge's
  // parts and their concatenation too; otherwise std::invalid_argument names the token.
  Bpe(std::unordered_map<std::string, int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      bool ignore_merges);
  // Appends the ids of `piece` (raw bytes) to `out`. Thread-safe (the cache is locked).
  void encode(std::string_view piece, std::vector<int>& out) const;
  const std::unordered_map<std::string, int>& vocab() const { return vocab_; }
  // Id of a token string, or -1.
  int id(const std::string& token) const;

 private:
  struct Merge {
    int rank;
    int id;
  };
  static uint64_t key(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find(int a, int b) const;
  void merge_word(std::string_view piece, std::vector<int>& out) const;

  std::unordered_map<std::string, int> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int, 256> byte_id_{};
  bool ignore_merges_;
  static constexpr size_t kCacheLimit = 1 << 16;  // words; a plain cap keeps memory bounded
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace mf
