// `moeforge bench generate`: decoding speed with the KV cache at batch 1 and 8, against the
// memory-bandwidth bound (every active weight read once per step, bandwidth measured here).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf {

struct GenerateBenchRow {
  int64_t batch = 0;
  double tokens_per_s = 0;  // generated tokens (all rows) per second, prefill included
};

struct GenerateBenchResult {
  Config config;
  std::vector<GenerateBenchRow> rows;
  double weight_bytes_per_step = 0;  // active parameters except the embedding table, float32
  double bandwidth_gbs = 0;          // large-copy bandwidth, read + write
  double bound_tokens_per_s = 0;     // batch 1: bandwidth / weight bytes per step
  std::string units_path;            // how the MoE layers ran their experts (moe/dispatch.h); "" = no MoE layer
};

// `source`: a TOML config (a randomly initialised model of that shape) or a checkpoint.
GenerateBenchResult bench_generate(const std::string& source, int64_t prompt_len, int64_t new_tokens,
                                   const std::vector<int64_t>& batches);

}  // namespace mf
