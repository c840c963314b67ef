// Small helpers shared by the test executables.
#pragma once
#include <cstdlib>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf::test {

// The source tree (ctest sets MOEFORGE_SOURCE_DIR; "." when run by hand from it).
inline std::string source_dir() {
  const char* s = std::getenv("MOEFORGE_SOURCE_DIR");
  return s ? s : ".";
}

// A small decoder: `heads` query heads sharing `kv_heads` key/value heads.
inline ModelConfig small_model(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t heads = 4,
                               int64_t kv_heads = 2) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = d_model;
  c.n_layers = n_layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  return c;
}

// The same with every block an MoE of `experts` experts of width `expert_hidden`, top-`top_k`.
inline ModelConfig small_moe(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t experts, int64_t top_k,
                             int64_t expert_hidden) {
  auto c = small_model(vocab, d_model, n_layers);
  c.ffn = "moe";
  c.moe.num_experts = experts;
  c.moe.top_k = top_k;
  c.moe.expert_hidden = expert_hidden;
  return c;
}

// The plain MoE decoder with every optional part: a dense first block, then MoE blocks of 8
// experts (top-2) with a gated shared expert; q/k/v biases, q/k norm per head; vocabulary 96.
inline ModelConfig plain_moe() {
  auto c = small_moe(96, 32, 3, 8, 2, 24);
  c.moe.layers = "first_dense:1";
  c.moe.n_shared = 1;
  c.moe.shared_gate = true;
  c.qkv_bias = true;
  c.qk_norm = "head";
  c.max_seq_len = 64;
  return c;
}

// The message of the ConfigError that applying `sets` (KEY=VALUE) and validating raises; "" if none.
inline std::string config_error(const std::vector<std::string>& sets) {
  Config c;
  try {
    for (auto& s : sets) apply_override(c, s);
    validate(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace mf::test
