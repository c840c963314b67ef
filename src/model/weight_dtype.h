// `--dtype bf16` for the commands that only run a model (generate, eval, serve, the analyses): the
// large matrices held in bfloat16, half the memory of float32, computed in float32 (core/bf16.h).
// `--dtype int8` (generate, eval, serve, bench generate) holds the same matrices in blocks of 32
// int8 numbers with a float32 scale (core/q8.h), those whose rows split into such blocks.
//
// Held in bf16: the token embedding and the LM head, the attention projections, dense FFNs, and the
// expert banks (routed and shared) of MoE slots no method extends — tensors whose every use goes
// through project(), embed_rows() or the experts' inference path. Kept in float32: norms and
// biases (small), routers (small, and the expert choice stays the trained one's up to the
// activations' rounding), and every tensor of a method's extension or slot (their own paths read
// them directly). Inference only: gradients through bf16 weights are not supported.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "model/transformer.h"

namespace mf {

at::ScalarType parse_weight_dtype(const std::string& name);  // "f32" | "bf16" | "int8" (ConfigError otherwise)
std::string weight_dtype_name(at::ScalarType dtype);         // its inverse

struct HeldWeights {
  int64_t tensors = 0, parameters = 0;  // held in the asked dtype
  int64_t kept = 0;                     // parameters left in float32
};
// Holds the LM's bf16-capable weights in `dtype` (kFloat: nothing changes; kChar: int8 blocks). With `values` the
// weights are rounded to it; without, they are left uninitialised, to be loaded next.
HeldWeights hold_weights(TransformerLMImpl& model, at::ScalarType dtype, bool values = true);

}  // namespace mf
