// Token shards (one file per domain and split) and the batch sampler that reads them.
// Shard file: "MFTOKS01", u64 count, u64 vocab_size, u64 FNV-1a of the payload, then
// count little-endian u16 tokens.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mf {

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens, uint64_t vocab_size);
std::vector<uint16_t> read_token_shard(const std::string& path, uint64_t vocab_size);  // validates

inline const std::vector<std::string>& split_names() {
  static const std::vector<std::string> s = {"train", "val", "test"};
  return s;
}

// A prepared corpus directory: manifest.json, tokenizer.model, tokens/*.bin.
class PreparedCorpus {
 public:
  explicit PreparedCorpus(const std::string& dir);  // loads and validates all shards
  const std::vector<std::string>& domains() const { return domains_; }
  const std::vector<uint16_t>& tokens(size_t domain, const std::string& split) const;
  int64_t vocab_size() const { return vocab_size_; }
  std::string tokenizer_path() const;
  const nlohmann::json& manifest() const { return manifest_; }

 private:
  std::string dir_;
  nlohmann::json manifest_;
  int64_t vocab_size_ = 0;
  std::vector<std::string> domains_;
  std::vector<std::vector<std::vector<uint16_t>>> data_;  // [domain][split]
};

struct Batch {
  at::Tensor inputs, targets;  // [B, T] int64
};

// Random contiguous windows from the train split with per-domain mixture weights.
// Batch (step, micro) depends only on (seed, step, micro): a resumed run sees the same data.
class BatchSampler {
 public:
  BatchSampler(const PreparedCorpus& corpus, std::vector<double> weights, int64_t seq_len, uint64_t seed);
  Batch sample(int64_t step, int64_t micro, int64_t batch_size) const;

 private:
  const PreparedCorpus& corpus_;
  std::vector<double> cumulative_;
  int64_t seq_len_;
  uint64_t seed_;
};

// `windows` fixed windows of seq_len+1 tokens spread evenly over a split (no randomness).
Batch fixed_windows(const std::vector<uint16_t>& tokens, int64_t seq_len, int64_t windows);
Batch fixed_windows(const std::vector<int>& tokens, int64_t seq_len, int64_t windows);  // vocabularies over 2^16

}  // namespace mf
