// `moeforge data prepare`: extract domains, train the tokenizer, write token shards and
// manifest.json. Idempotent: skipped when the manifest's input fingerprint matches.
#pragma once
#include <nlohmann/json.hpp>

#include "core/config.h"

namespace mf {

struct PrepareResult {
  nlohmann::json manifest;
  bool skipped = false;
};

PrepareResult prepare_corpus(const DataConfig& cfg, bool force);
std::string prepare_fingerprint(const DataConfig& cfg);

// H = -sum_v p(v) log p(v) in nats over the given token counts
double unigram_entropy(const std::vector<int64_t>& counts);

}  // namespace mf
