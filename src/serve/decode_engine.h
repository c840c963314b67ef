// The decode engine: one new token per row through the whole model in plain loops over the
// weights' memory, for decoding with a KV cache.
//
// Why: a decoded token is a handful of matrix-times-vector products, each far shorter than the
// LibTorch operator calls around it. The module path spends ~1,500 such calls per token on the
// quickstart model (routing, dispatch, statistics, views), and its speed was a sixth of the
// memory-bandwidth bound. Here a step runs, per layer, RMSNorm, the q/k/v projections (the
// row kernel of core/row_kernel.h, float32, bf16 or int8 weights), RoPE, attention over this
// engine's own cache, the output projection, and the FFN: a dense SwiGLU/GELU, or a top-k router
// and the chosen experts' products grouped by expert across rows, shared experts and their gate;
// then the final norm and the head. Buffers are allocated once; the only LibTorch call of a step is the
// logits tensor it returns (`bench generate` counts them).
//
// Each row (slot) keeps its own position, so rows at different lengths decode together (what a
// server that admits requests between steps needs). A slot may also take several consecutive
// tokens in one step (a prompt, or part of one, beside the rows decoding): each row attends to
// the keys up to its own position. Every row's numbers are computed the same way whatever else
// is in the step (the kernels' sums run in one order per output), so a prompt fed in one step
// or token by token, alone or beside others, gives the same logits bit for bit. Prompts run here
// too, kPrefillRows tokens a step (faster than the modules' GEMMs at 128 and 512 tokens,
// docs/benchmarks.md); `load` takes over a cache the modules filled.
//
// It runs the plain LLaMA/Mixtral/Qwen-style model: float32, bf16 or int8 weights, SwiGLU or GELU
// FFNs, MoE blocks with softmax, sigmoid or norm top-k routers (selection bias, renormalisation,
// gate scale), expert biases and shared experts. A method's slot (an extension, another FFN
// kind), a capacity limit, a probe's routing, float64 weights or another router are run by the
// modules instead (`unsupported` says which).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace mf {

class DecodeEngine {
 public:
  // "" when the engine runs `model`, else what it does not run (naming the block)
  static std::string unsupported(TransformerLMImpl& model);
  // `slots`: sequences held at once. Reads the weights in place: they must not change while the engine lives.
  DecodeEngine(TransformerLMImpl& model, int64_t slots);
  ~DecodeEngine();
  int64_t slots() const;
  int64_t length(int64_t slot) const;  // tokens in the slot's cache
  // the slot takes batch row `row` of a module forward's caches (its prompt's keys and values)
  void load(int64_t slot, const std::vector<LayerCache>& caches, int64_t row);
  void clear(int64_t slot);
  // tokens[i] appended to slots[i]'s sequence, rows of one slot in order at consecutive positions
  // -> next-token logits [n, V] (float32) of each slot's last row, in row order; at most
  // slots() + kPrefillRows rows
  at::Tensor step(const std::vector<int64_t>& slots, const std::vector<int64_t>& tokens);
  // the slot's sequence continued by `tokens` (kPrefillRows per step) -> the last one's logits [V]
  at::Tensor prefill(int64_t slot, const std::vector<int64_t>& tokens);
  // prompt rows one step takes beside the decoding rows (decode_rows prefills longer prompts in
  // steps of this many; the decode stream hands them to the modules, then load())
  static constexpr int64_t kPrefillRows = 64;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mf
