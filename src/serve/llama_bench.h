// llama.cpp decoding the same model as `moeforge bench generate`: the model exported to GGUF
// (f32, f16, q8_0) and timed by node-llama-cpp's prebuilt CPU build (tests/llama/llama_peer.mjs).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mf {

// {"f32": tokens/s, "f16": ..., "q8_0": ...} at batch 1, the best of `threads` and 1 thread (with
// "<dtype>_threads" saying which and "<dtype>_threads_<n>" each), or {"skipped": why}. `source` as in
// bench_generate: a TOML config's random weights are written to a scratch checkpoint first (with
// the corpus tokenizer, which llama.cpp needs to load a model).
// With `prefill` lengths also "prefill": {"<dtype>": {"<length>": prompt tokens/s}} (the better thread count).
nlohmann::json llama_cpp_decode(const std::string& source, const std::string& peer, int64_t prompt_len,
                                int64_t new_tokens, int threads, const std::vector<int64_t>& prefill = {});

}  // namespace mf
