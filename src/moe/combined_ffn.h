// Experts straight from x: the units of grouped_ffn (moe/grouped_ffn.h) run on pairs taken from
// x_TD chunk by chunk -- gather a chunk's rows, its unit's FFN, weighted combine -- while the
// chunk is in cache, without the [P, D] rows and outputs of gather -> grouped_ffn -> combine
// (k times the tokens: 268 MB a layer at T 4096, k 32, D 512).
#pragma once
#include <ATen/ATen.h>

namespace mf {

// y_TD[t] = sum over pairs p with token_P[p] = t of weight_P[p] * unit_{u(p)}(x_TD[t]), the pairs
// sorted by unit (counts_U per unit), units as in grouped_ffn (blocks per expert, biases) in
// chunks of chunk_hidden / M rows (M = a unit's hidden width F / blocks). The default chunk is
// 512 rows of a 1536-wide expert (3 MB of float32 hidden activations); narrow units (UniF-MoE's
// blocks, fine-grained experts) take proportionally more rows, up to the largest unit.
//
// Under grad mode with anything requiring grad, differentiable in x_TD, weight_P, the weights and
// the biases: the forward keeps each pair's hidden pre-activation H [P, 2M|M] (as a dense FFN
// keeps its hidden activations) and the backward recomputes A from it, chunk by chunk again:
//   G = dy[token] W2            dweight_P = rowsum(A * G) (+ dy[token] . b2)
//   dW2 += dy[token]^T (w A)    dA = w G     dH = act'(H, dA)     dW1 += dH^T X
//   dx[token] += dH W1          db1 += colsum dH,   db2 += w^T dy[token]
// Pairs are combined in unit order, so y equals gather -> grouped_ffn -> combine up to the GEMMs'
// rounding. With several threads and at least two non-empty units per thread, threads take whole
// units (split_units, balanced by pair count) with one-thread GEMMs into [T, D] outputs (and dx)
// of their own, summed at the end: the sums' order then differs from the one-thread path.
//
// With a UnitPack (the caller's cache of packed weights; float32 x on the CPU; no grad), each
// unit runs the fused kernel of moe/fused_units.h instead (gather and combine inside the GEMMs).
inline constexpr int64_t kCombinedChunkHidden = 512 * 1536;
class UnitPack;
at::Tensor grouped_ffn_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                const at::Tensor& counts_U, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                                bool swiglu, const at::Tensor& gate_up_bias = {}, const at::Tensor& down_bias = {},
                                int64_t blocks = 1, int64_t chunk_hidden = kCombinedChunkHidden,
                                UnitPack* pack = nullptr);

}  // namespace mf
