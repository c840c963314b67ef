#include "data/tokenizer_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "data/corpus.h"
#include "data/hf_tokenizer.h"

namespace mf {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json run_peer(const std::string& script, const std::string& tokenizer, const std::vector<std::string>& docs) {
  namespace fs = std::filesystem;
  if (!fs::exists(script)) return {{"skipped", "peer script not found: " + script}};
  const auto input = fs::temp_directory_path() / fmt::format("mf_tokenizer_bench_{}.jsonl", ::getpid());
  {
    std::ofstream out(input);
    for (const auto& d : docs) out << nlohmann::json(d).dump() << "\n";
  }
  FILE* p = ::popen(fmt::format("node '{}' '{}' '{}' 2>&1", script, tokenizer, input.string()).c_str(), "r");
  std::string text;
  if (p) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  }
  const int rc = p ? ::pclose(p) : -1;
  fs::remove(input);
  const auto brace = text.rfind('{');
  if (rc != 0 || brace == std::string::npos)
    return {{"skipped", "peer failed (node and tests/npm from scripts/setup.sh?): " + text.substr(0, 300)}};
  return nlohmann::json::parse(text.substr(brace));
}

}  // namespace

TokenizerBench bench_tokenizer(const std::string& tokenizer_json, const std::vector<std::string>& docs,
                               const std::string& peer_script, int threads) {
  TokenizerBench r;
  r.documents = static_cast<int64_t>(docs.size());
  r.threads = threads;
  for (const auto& d : docs) r.bytes += static_cast<int64_t>(d.size());
  const auto pass = [&](const HfTokenizer& t) {
    int64_t tokens = 0;
    for (const auto& d : docs) tokens += static_cast<int64_t>(t.encode(d).size());
    return tokens;
  };
  const HfTokenizer tokenizer(tokenizer_json);
  auto t0 = std::chrono::steady_clock::now();
  r.tokens = pass(tokenizer);
  r.cold_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  pass(tokenizer);
  r.serial_seconds = seconds_since(t0);
  std::atomic<size_t> next{0};
  t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&] {
      for (size_t d; (d = next++) < docs.size();) tokenizer.encode(docs[d]);
    });
  for (auto& t : pool) t.join();
  r.threads_seconds = seconds_since(t0);
  r.peer = peer_script.empty() ? nlohmann::json{{"skipped", "no peer"}} : run_peer(peer_script, tokenizer_json, docs);
  if (!r.peer.contains("skipped") && r.peer["tokens"].get<int64_t>() != r.tokens)
    throw std::runtime_error(
        fmt::format("token counts differ: ours {}, Hugging Face {}", r.tokens, r.peer["tokens"].get<int64_t>()));
  return r;
}

std::vector<std::string> corpus_documents(const std::string& source_root, int64_t bytes) {
  std::vector<std::string> docs;
  for (const auto& d : builtin_domains()) {
    int64_t taken = 0;
    for (auto& doc : extract_domain(d, source_root, bytes * 2)) {
      if (taken >= bytes) break;
      taken += static_cast<int64_t>(doc.size());
      docs.push_back(std::move(doc));
    }
  }
  return docs;
}

ResultTable tokenizer_table(const TokenizerBench& r) {
  ResultTable t({{"implementation", "implementation", "", -44},
                 {"seconds", "seconds", "{:.3f}", 9},
                 {"mb_per_s", "MB/s", "{:.2f}", 9},
                 {"vs_ours", "vs ours", "{:.2f}x", 9}});
  const auto row = [&](const std::string& name, double seconds) {
    t.add({{"implementation", name},
           {"seconds", seconds},
           {"mb_per_s", static_cast<double>(r.bytes) / 1e6 / seconds},
           {"vs_ours", seconds / r.serial_seconds}});
  };
  row("moeforge, 1 thread, first pass", r.cold_seconds);
  row("moeforge, 1 thread, second pass (ours)", r.serial_seconds);
  row(fmt::format("moeforge, {} threads", r.threads), r.threads_seconds);
  if (!r.peer.contains("skipped")) {
    row("HF tokenizers (Node), 1 call/doc, first pass", r.peer["cold_seconds"].get<double>());
    row("HF tokenizers (Node), 1 call/doc, second", r.peer["serial_seconds"].get<double>());
    row("HF tokenizers encodeBatch (its thread pool)", r.peer["batch_seconds"].get<double>());
  }
  return t;
}

nlohmann::json tokenizer_json(const TokenizerBench& r) {
  return {{"documents", r.documents}, {"bytes", r.bytes}, {"tokens", r.tokens},
          {"threads", r.threads},     {"peer", r.peer},   {"rows", tokenizer_table(r).json()}};
}

}  // namespace mf
