// The model's blocks as the decode engine (serve/decode_engine.h) reads them: each block's norms,
// projections and FFN as row-kernel matrices (serve/decode_parts.h), and what it does not run.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "model/moe_ffn.h"
#include "serve/decode_parts.h"

namespace mf::decoding {

// one block: its norms' weights, attention's projections (and q/k norms), and its FFN
struct Layer {
  const float *norm_in = nullptr, *norm_post = nullptr;
  Matrix q, k, v, o;
  const float *q_norm = nullptr, *k_norm = nullptr;  // model.qk_norm
  bool norm_per_head = false;
  bool moe = false;
  std::vector<Unit> units;  // MoE: the routed experts; dense: the FFN
  Router router;
  std::optional<Unit> shared;
  Matrix shared_gate;  // N = 0: none
};

// "" when the engine runs this MoE slot, else what it does not run
std::string moe_unsupported(const MoEFeedForward& f);
Layer dense_layer(FeedForward& ffn);
Layer moe_layer(MoEFeedForward& f);

}  // namespace mf::decoding
