// Continuous batching: rows join and leave between decode steps. Up to `slots` rows decode
// together in the decode engine (serve/decode_engine.h), each at its own position in its own
// cache slot; a row added between steps has its prompt fed from the next step on beside the
// rows decoding (DecodeEngine::kPrefillRows tokens of it a step, as room allows), and picks its
// first token at the step after its last prompt token; a row that ends frees its slot at once. Each row samples from
// its own generator and the engine computes each row's numbers the same whatever else is in the step, so a row's tokens
// equal generate() on its prompt and options, whoever shares its steps.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "serve/decode_engine.h"
#include "serve/generate.h"

namespace mf {

class DecodeStream {
 public:
  // throws ConfigError naming what the engine does not run (serve falls back to static batches)
  DecodeStream(TransformerLM model, int64_t slots);
  bool has_room() const { return static_cast<int64_t>(rows_.size()) < engine_.slots(); }
  bool empty() const { return rows_.empty(); }
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  // The row joins (its prompt is fed at the next step); returns its id.
  int64_t add(DecodeRow row);
  // Every row picks its next token (on_token); rows that end (stop token, max_tokens, on_token
  // false, the context full) leave; the others advance one position together. Returns the ids of
  // the rows that ended.
  std::vector<int64_t> step();

 private:
  struct Live {
    int64_t id, slot, produced = 0;
    DecodeRow row;
    at::Generator gen;
    at::Tensor logits_V;          // its next token's logits
    std::vector<int64_t> prompt;  // still to feed
  };
  TransformerLM model_;
  DecodeEngine engine_;
  std::vector<Live> rows_;
  std::vector<int64_t> free_slots_;
  int64_t next_id_ = 0;
};

}  // namespace mf
