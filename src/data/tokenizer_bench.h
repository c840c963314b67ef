// `moeforge bench tokenizer`: encode throughput of our tokenizer.json implementation against
// Hugging Face's library (bench/peers/hf_tokenizer.js) on the same corpus documents.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/table.h"

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
// Throws when the peer's token count differs from ours.
TokenizerBench bench_tokenizer(const std::string& tokenizer_json, const std::vector<std::string>& docs,
                               const std::string& peer_script, int threads);

// Up to `bytes` of text from each built-in corpus domain, whole documents, from the packages
// under `source_root`.
std::vector<std::string> corpus_documents(const std::string& source_root, int64_t bytes);

// One row per implementation and pass: seconds, MB/s, and seconds relative to our second pass.
ResultTable tokenizer_table(const TokenizerBench& r);
// The figures behind it, with the table's rows (`--json`).
nlohmann::json tokenizer_json(const TokenizerBench& r);

}  // namespace mf
