// `moeforge bench tokenizer`: encode throughput of our tokenizer.json implementation against
// Hugging Face's library (bench/peers/hf_tokenizer.js) on the same corpus documents.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mf {

struct TokenizerBench {
  int64_t bytes = 0, documents = 0, tokens = 0;
  double cold_seconds = 0;     // first pass, a fresh tokenizer, one document per call
  double serial_seconds = 0;   // a second pass (warm word cache)
  double threads_seconds = 0;  // documents spread over `threads` threads
  int threads = 1;
  nlohmann::json peer;  // the peer's seconds and token count, or {"skipped": why}
};

// `docs` are encoded with the tokenizer at `tokenizer_json`; `peer_script` '' skips the peer.
TokenizerBench bench_tokenizer(const std::string& tokenizer_json, const std::vector<std::string>& docs,
                               const std::string& peer_script, int threads);

}  // namespace mf
