// `moeforge bench serve`: the HTTP server under 1, 4, 16... concurrent clients on loopback:
// generated tokens per second and request latency percentiles, and how many rows the batcher
// decoded together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "core/table.h"

namespace mf {

struct ServeBenchRow {
  std::string batching;  // continuous or static (serve/batcher.h)
  int64_t clients = 0, requests = 0, tokens = 0;
  double seconds = 0, tokens_per_s = 0, p50_ms = 0, p95_ms = 0, rows_per_step = 0;
};

// `source`: a TOML config (random weights of that shape, the tokenizer of its data.dir) or a
// checkpoint. Each client sends `requests` completions of `max_tokens` tokens one after another
// (sampled at temperature 0.8 with its own seed; one prompt, so every row has one length), its
// first after a delay drawn uniformly from [0, arrivals_s) (seeded: the same in every run), with
// the server batching each way of `batchings` in turn.
// The rows as printed and written by `bench serve`.
ResultTable serve_bench_table(const std::vector<ServeBenchRow>& rows);
std::vector<ServeBenchRow> bench_serve(const std::string& source, const std::vector<int64_t>& clients, int64_t requests,
                                       int64_t max_tokens, double arrivals_s = 0,
                                       const std::vector<std::string>& batchings = {"continuous"});

}  // namespace mf
