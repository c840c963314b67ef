// `moeforge data prepare`: extract domains, train the tokenizer, write token shards and
// manifest.json. Idempotent: skipped when the manifest's input fingerprint matches.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>

#include "core/config.h"

namespace mf {

struct PrepareResult {
  nlohmann::json manifest;
  bool skipped = false;
};

PrepareResult prepare_corpus(const DataConfig& cfg, bool force);
std::string prepare_fingerprint(const DataConfig& cfg);

class Tokenizer;
// The split (0 train, 1 val, 2 test) of each of a domain's documents: 98/1/1 by a hash of
// (domain, index); in a tiny corpus the last documents go to test and val so neither is empty.
std::vector<int> document_splits(const std::string& domain, size_t documents);
// The documents of `split` of every corpus domain, encoded with `tok` (documents end with
// its eos token when it has one): how a model with its own tokenizer (a Hugging Face one)
// is evaluated on the same documents as the prepared corpus's split.
// `only` names one domain to encode ("" = all).
std::vector<std::pair<std::string, std::vector<int>>> retokenized_split(const DataConfig& cfg, const Tokenizer& tok,
                                                                        const std::string& split,
                                                                        const std::string& only = "");
// The prepared corpus at `dir` when it can be read and its vocabulary has `vocab` entries
// (the model was trained on it), else nullptr: the caller re-encodes with the model's tokenizer.
class PreparedCorpus;
std::unique_ptr<PreparedCorpus> corpus_for_model(const std::string& dir, int64_t vocab);

// H = -sum_v p(v) log p(v) in nats over the given token counts
double unigram_entropy(const std::vector<int64_t>& counts);

}  // namespace mf
