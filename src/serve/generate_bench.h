// `moeforge bench generate`: decoding speed with the KV cache at batch 1 and 8, against the
// memory-bandwidth bound (every active weight read once per step, bandwidth measured here).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/table.h"

namespace mf {

struct GenerateBenchRow {
  int64_t batch = 0;
  std::string weights = "f32";    // the dtype the weights were held in (model/weight_dtype.h)
  std::string decode = "engine";  // the decode engine (serve/decode_engine.h) or the modules
  double tokens_per_s = 0;        // generated tokens (all rows) per second, prefill included
  double step_tokens_per_s = 0;   // the decode steps alone: tokens after each row's first, from the first to the last
  double calls_per_step = 0;      // LibTorch operator calls per decode step (prefill and sampling included)
  // batch 1: the median of kBoundRounds rounds by this ratio of the decode steps' speed to the
  // bound (weight bytes per step at the streaming read, the faster of the reads before and after it)
  double vs_bound = 0, read_gbs = 0;
};
constexpr int kBoundRounds = 3;

// Batch 1's rounds against the bound: `rounds[i]` timed between streaming reads `reads[i]` and
// `reads[i + 1]` (GB/s), `bytes` the weights read per decode step -> the round of the median ratio,
// its bound's bandwidth the faster of its two reads, vs_bound = step tokens/s x bytes / bandwidth
GenerateBenchRow median_beside_bound(std::vector<GenerateBenchRow> rounds, const std::vector<double>& reads,
                                     double bytes);

// Prompt processing at batch 1: prompt tokens per second up to the first new token (prefill, by the
// decode engine in steps of DecodeEngine::kPrefillRows tokens where it runs the model, and picking
// that token).
struct PrefillBenchRow {
  int64_t prompt = 0;
  std::string weights = "f32";
  double tokens_per_s = 0;
};

struct GenerateBenchResult {
  Config config;
  std::vector<GenerateBenchRow> rows;
  std::vector<PrefillBenchRow> prefill;
  double weight_bytes_per_step = 0;  // active parameters except the embedding table, float32 (bf16: half)
  double read_gbs = 0;  // streaming-read bandwidth (core/bandwidth.h), the higher of the benchmark's start and end
                        // (batch 1's rows take their own, measured beside them: GenerateBenchRow::vs_bound)
  double copy_gbs = 0;  // large-copy bandwidth, read + write, for comparison (the same)
  double bound_tokens_per_s = 0;   // batch 1: read bandwidth / weight bytes per step
  std::string units_path;          // how the modules' MoE layers ran their experts (moe/dispatch.h); "" = no MoE layer
  std::string engine_unsupported;  // DecodeEngine::unsupported: "" where the engine decodes
};

// `source`: a TOML config (a randomly initialised model of that shape) or a checkpoint; each batch
// size with the weights held in each of `weights` ("f32", "bf16", "int8"; float32 runs first),
// decoded by the engine (where it runs the model) and by the modules; prompts of each `prefill`
// length (at most model.max_seq_len) processed at batch 1.
GenerateBenchResult bench_generate(const std::string& source, int64_t prompt_len, int64_t new_tokens,
                                   const std::vector<int64_t>& batches,
                                   const std::vector<std::string>& weights = {"f32", "bf16"},
                                   const std::vector<int64_t>& prefill = {});

// r beside the same model decoded in PyTorch (`peer`, bench/peers/generate.py; "" skips it) and in
// llama.cpp at batch 1 (`llama`, tests/llama/llama_peer.mjs; "" skips it): the table, its JSON and
// the lines saying what ran and what bounds it.
struct GenerateBenchReport {
  ResultTable table, prefill;
  nlohmann::json json;
  std::string note;
};
GenerateBenchReport generate_bench_report(const GenerateBenchResult& r, const std::string& source,
                                          const std::string& peer, const std::string& llama, int64_t prompt_len,
                                          int64_t new_tokens, int threads, const std::vector<int64_t>& prefill = {});

}  // namespace mf
