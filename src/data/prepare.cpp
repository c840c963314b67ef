#include "data/prepare.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/util.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace mf {
namespace fs = std::filesystem;

static constexpr int kFormat = 1;

std::string prepare_fingerprint(const DataConfig& c) {
  std::string key =
      fmt::format("{}|{}|{}|{}|{}", kFormat, c.vocab_size, c.tokenizer_sample_bytes, c.max_source_bytes, c.source_root);
  for (const auto& d : builtin_domains())
    for (const auto& f : d.files) {
      fs::path p = fs::path(c.source_root) / f;
      std::vector<fs::path> files;
      if (fs::is_directory(p)) {
        for (auto& e : fs::directory_iterator(p)) files.push_back(e.path());
        std::sort(files.begin(), files.end());
      } else {
        files.push_back(p);
      }
      for (auto& q : files)
        if (fs::is_regular_file(q))
          key +=
              fmt::format("|{}:{}:{}", q.string(), fs::file_size(q), fs::last_write_time(q).time_since_epoch().count());
    }
  return hex64(fnv1a64(key.data(), key.size()));
}

double unigram_entropy(const std::vector<int64_t>& counts) {
  double total = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  double h = 0;
  for (auto c : counts)
    if (c > 0) h -= (c / total) * std::log(c / total);
  return h;
}

// 98/1/1 by document, decided by a hash of (domain, document index) only.
static int split_of(const std::string& domain, size_t doc) {
  uint64_t h = mix_seed(fnv1a64(domain.data(), domain.size()), doc) % 100;
  return h < 98 ? 0 : (h < 99 ? 1 : 2);
}

std::vector<int> document_splits(const std::string& domain, size_t documents) {
  std::vector<int> out(documents);
  std::vector<int64_t> count(3, 0);
  for (size_t i = 0; i < documents; ++i) {
    int s = split_of(domain, i);
    // tiny corpora: make sure val and test are never empty
    if (s == 0 && i + 1 == documents && count[2] == 0) s = 2;
    if (s == 0 && i + 2 == documents && count[1] == 0) s = 1;
    ++count[s];
    out[i] = s;
  }
  return out;
}

std::unique_ptr<PreparedCorpus> corpus_for_model(const std::string& dir, int64_t vocab) {
  try {
    auto corpus = std::make_unique<PreparedCorpus>(dir);
    if (corpus->vocab_size() == vocab) return corpus;
    spdlog::info("the corpus at '{}' has {} tokens in its vocabulary, the model {}", dir, corpus->vocab_size(), vocab);
  } catch (const std::exception& e) {
    spdlog::info("no prepared corpus to use at '{}' ({})", dir, e.what());
  }
  return nullptr;
}

std::vector<std::pair<std::string, std::vector<int>>> retokenized_split(const DataConfig& cfg, const Tokenizer& tok,
                                                                        const std::string& split,
                                                                        const std::string& only) {
  const auto wanted = std::find(split_names().begin(), split_names().end(), split) - split_names().begin();
  std::vector<std::pair<std::string, std::vector<int>>> out;
  for (const auto& d : builtin_domains()) {
    if (!only.empty() && d.name != only) continue;
    const auto docs = extract_domain(d, cfg.source_root, cfg.max_source_bytes);
    const auto splits = document_splits(d.name, docs.size());
    std::vector<int> ids;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (splits[i] != wanted) continue;
      const auto doc = tok.encode(docs[i]);
      ids.insert(ids.end(), doc.begin(), doc.end());
      if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
    }
    out.emplace_back(d.name, std::move(ids));
  }
  return out;
}

static std::vector<std::vector<int>> encode_all(const Tokenizer& tok, const std::vector<std::string>& docs,
                                                Progress& bar, int64_t& done, int64_t total) {
  std::vector<std::vector<int>> out(docs.size());
  const size_t n_threads = 2, chunk = 256;
  for (size_t base = 0; base < docs.size(); base += chunk * n_threads) {
    std::vector<std::thread> workers;
    for (size_t w = 0; w < n_threads; ++w)
      workers.emplace_back([&, w] {
        for (size_t i = base + w * chunk; i < std::min(docs.size(), base + (w + 1) * chunk); ++i)
          out[i] = tok.encode(docs[i]);
      });
    for (auto& t : workers) t.join();
    done += static_cast<int64_t>(std::min(docs.size(), base + chunk * n_threads) - base);
    bar.update(done, "encoding");
  }
  (void)total;
  return out;
}

PrepareResult prepare_corpus(const DataConfig& cfg, bool force) {
  const fs::path dir(cfg.dir);
  const auto manifest_path = (dir / "manifest.json").string();
  const std::string fingerprint = prepare_fingerprint(cfg);
  if (!force && fs::exists(manifest_path)) {
    try {
      auto m = nlohmann::json::parse(read_file(manifest_path));
      if (m.value("fingerprint", "") == fingerprint) {
        PreparedCorpus check(cfg.dir);  // validates shards and tokenizer checksum
        spdlog::info("data in '{}' is up to date (fingerprint {}); nothing to do", cfg.dir, fingerprint);
        return {m, true};
      }
    } catch (const std::exception& e) {
      spdlog::warn("existing data in '{}' is unusable ({}); rebuilding", cfg.dir, e.what());
    }
  }
  fs::create_directories(dir / "tokens");

  // 1. extract documents
  const auto& domains = builtin_domains();
  std::vector<std::vector<std::string>> docs;
  Progress extract("extracting", static_cast<int64_t>(domains.size()));
  for (size_t i = 0; i < domains.size(); ++i) {
    extract.update(static_cast<int64_t>(i), domains[i].name);
    docs.push_back(extract_domain(domains[i], cfg.source_root, cfg.max_source_bytes));
  }
  extract.finish();

  // 2. balanced tokenizer sample from training documents, one line per sentence
  std::string sample;
  for (size_t d = 0; d < domains.size(); ++d) {
    std::vector<size_t> order(docs[d].size());
    std::iota(order.begin(), order.end(), 0);
    SplitMix64 rng(fnv1a64(domains[d].name.data(), domains[d].name.size()));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    int64_t taken = 0;
    for (size_t i : order) {
      if (taken >= cfg.tokenizer_sample_bytes) break;
      if (split_of(domains[d].name, i) != 0) continue;
      std::string line;
      std::istringstream ss(docs[d][i]);
      while (std::getline(ss, line)) {
        if (line.empty()) continue;
        sample += line + "\n";
        taken += static_cast<int64_t>(line.size()) + 1;
      }
    }
  }
  spdlog::info("training SentencePiece BPE tokenizer (vocab {}) on {:.1f} MB ...", cfg.vocab_size, sample.size() / 1e6);
  train_tokenizer(sample, (dir / "tokenizer.model").string(), static_cast<int>(cfg.vocab_size),
                  (dir / "tokenizer_train.log").string());
  Tokenizer tok((dir / "tokenizer.model").string());
  const int vocab = tok.vocab_size();

  // 3. encode, split by document, write shards
  int64_t total_docs = 0, done = 0;
  for (auto& d : docs) total_docs += static_cast<int64_t>(d.size());
  Progress bar("tokenizing", total_docs);
  nlohmann::json m = {{"format", kFormat},
                      {"fingerprint", fingerprint},
                      {"tokenizer",
                       {{"file", "tokenizer.model"},
                        {"vocab_size", vocab},
                        {"checksum", file_checksum((dir / "tokenizer.model").string())}}},
                      {"domains", nlohmann::json::array()}};
  std::vector<int64_t> all_counts(vocab, 0);
  for (size_t d = 0; d < domains.size(); ++d) {
    const auto& name = domains[d].name;
    auto encoded = encode_all(tok, docs[d], bar, done, total_docs);
    std::vector<std::vector<uint16_t>> splits(3);
    std::vector<int64_t> split_docs(3, 0), counts(vocab, 0);
    int64_t bytes = 0;
    const auto split_of_doc = document_splits(name, encoded.size());
    for (size_t i = 0; i < encoded.size(); ++i) {
      const int s = split_of_doc[i];
      for (int id : encoded[i]) splits[s].push_back(static_cast<uint16_t>(id));
      splits[s].push_back(static_cast<uint16_t>(tok.eos_id()));
      ++split_docs[s];
      bytes += static_cast<int64_t>(docs[d][i].size());
    }
    for (auto t : splits[0]) {
      ++counts[t];
      ++all_counts[t];
    }
    nlohmann::json dj = {{"name", name},
                         {"package", domains[d].package},
                         {"documents", encoded.size()},
                         {"bytes", bytes},
                         {"unigram_entropy_nats", unigram_entropy(counts)},
                         {"splits", nlohmann::json::object()}};
    for (int s = 0; s < 3; ++s) {
      std::string file = fmt::format("tokens/{}.{}.bin", name, split_names()[s]);
      write_token_shard((dir / file).string(), splits[s], static_cast<uint64_t>(vocab));
      dj["splits"][split_names()[s]] = {{"file", file}, {"tokens", splits[s].size()}, {"documents", split_docs[s]}};
    }
    m["domains"].push_back(dj);
  }
  bar.finish();
  m["unigram_entropy_nats"] = unigram_entropy(all_counts);
  write_file_atomic(manifest_path, m.dump(2) + "\n");
  return {m, false};
}

}  // namespace mf
