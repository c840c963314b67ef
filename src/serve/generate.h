// Autoregressive sampling with a KV cache: temperature, nucleus (top-p), seeded.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace mf {

// Temperatures below this sample greedily: T -> 0's limit, where logits / T would overflow.
constexpr double kGreedyBelow = 1e-6;

struct SamplingOptions {
  int64_t max_tokens = 64;
  double temperature = 0.8;  // below kGreedyBelow (0 included): greedy
  double top_p = 0.9;
  uint64_t seed = 7;
  int stop_token = -1;  // e.g. the tokenizer's EOS
};

// One row of decode_rows: its prompt, its own sampling options (and generator, seeded
// opt.seed), and what happens to each new token. on_token returns false to end the row there
// (a stop string, a client that went away); a stop token or max_tokens also ends it.
struct DecodeRow {
  std::vector<int> prompt;
  SamplingOptions opt;
  std::function<bool(int token)> on_token;
};

// Rows whose prompts have one length (after truncation to the context) decoded together: one
// forward per step for the rows still running, one KV cache; a row that ends leaves the batch
// (its cache rows are dropped). Stops at the context length.
// The steps after the prompt run in the decode engine (serve/decode_engine.h) where it runs the
// model (Auto), or by the modules; Engine insists (an error names what it does not run).
enum class DecodePath { Auto, Engine, Modules };
void decode_rows(TransformerLM& model, std::vector<DecodeRow>& rows, DecodePath path = DecodePath::Auto);

// Returns only the newly generated token ids.
std::vector<int> generate(TransformerLM& model, const std::vector<int>& prompt, const SamplingOptions& opt,
                          DecodePath path = DecodePath::Auto);

// Several prompts of one length decoded together (one forward per step for the whole batch,
// one KV cache); row r's ids stop at its first stop token. Row r samples from its own
// generator seeded opt.seed + r, so row 0 equals generate() on that prompt.
std::vector<std::vector<int>> generate_batch(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                                             const SamplingOptions& opt, DecodePath path = DecodePath::Auto);

// The next token of a row from its last logits [V], by its options and generator.
int64_t pick_token(const at::Tensor& logits_V, const SamplingOptions& opt, at::Generator& gen);
// The rows' prompts as decode_rows feeds them, [rows, length]: truncated to the last max_len - 1
// tokens, an empty one replaced by the stop token (or 0); throws when their lengths differ.
at::Tensor prompt_batch(const std::vector<DecodeRow>& rows, int64_t max_len);

// The index of the first largest of v's n numbers, a NaN counting as the largest (at::argmax's rule).
int64_t first_max(const float* v, int64_t n);

// Keeps the smallest set of most probable tokens whose mass reaches top_p; renormalizes.
at::Tensor top_p_filter(const at::Tensor& probs, double top_p);

// The trainer's periodic sample (TrainOptions::sample): `s.prompt` continued with s's settings
// by the tokenizer at the given path, returned as text with the prompt.
std::function<std::string(TransformerLM&, const std::string& tokenizer_path)> prompt_sampler(const SampleConfig& s);

}  // namespace mf
