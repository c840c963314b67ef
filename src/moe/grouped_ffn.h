// Grouped expert FFN with a hand-written backward. Autograd through per-expert slices
// (rows.narrow, weight[e]) materialises a zero-filled full-size gradient per expert
// (E x [P, D] and E x [E, 2F, D]); here every gradient is written once, slice by slice.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace mf {

// rows_PD grouped by unit (counts_U[u] rows each, in order), gate_up_E2FD (swiglu) or
// gate_up_EFD (gelu), down_EDF, optional biases gate_up_bias [E, 2F|F], down_bias [E, D]
// (undefined tensors = none) -> [P, D]; differentiable in rows, weights and biases.
//
// blocks = G splits every expert's hidden width F into G aligned blocks of M = F / G channels
// (block b: channels [bM, (b+1)M) of gate, up and down together), and a unit is one
// (expert, block) pair: U = E * G, unit u = expert u / G, block u % G. Since the activation
// acts per channel, an expert's output is the sum of its blocks' outputs. The output bias
// belongs to the whole expert, so it is refused with G > 1 (the caller adds it once).
// The per-unit loop needs the counts on the host: one copy of counts_U per call (this is
// the fallback path; a grouped GEMM would take counts_U on the device).
at::Tensor grouped_ffn(const at::Tensor& rows_PD, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                       const at::Tensor& counts_U, bool swiglu, const at::Tensor& gate_up_bias = {},
                       const at::Tensor& down_bias = {}, int64_t blocks = 1);

// The inference path (no autograd; refused under grad mode): the same units as grouped_ffn,
// with pairs taken straight from x_TD (token_P, weight_P sorted by unit, counts_U per unit) in
// chunks of chunk_hidden / M rows (M = a unit's hidden width F / blocks): gather, unit FFN and
// weighted combine per chunk while it is in cache, without the [P, D] rows and outputs of
// gather -> grouped_ffn -> combine. Pairs are combined in the same order, so y equals that
// path's up to the GEMMs' rounding. The default chunk is 512 rows of a 1536-wide expert (3 MB of
// float32 hidden activations); narrow units (UniF-MoE's blocks) take proportionally more rows.
// With several threads and at least two non-empty units per thread, threads take whole units
// (split_units: balanced by pair count) and run them with one-thread GEMMs into outputs of their
// own, summed at the end; y then differs from the one-thread path in the order of its sums.
//
// With a UnitPack (the caller's cache of packed weights; float32 x on the CPU), each
// unit runs the fused kernel of moe/fused_units.h instead (gather and combine inside the GEMMs).
inline constexpr int64_t kCombinedChunkHidden = 512 * 1536;
class UnitPack;
at::Tensor grouped_ffn_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                const at::Tensor& counts_U, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                                bool swiglu, const at::Tensor& gate_up_bias = {}, const at::Tensor& down_bias = {},
                                int64_t blocks = 1, int64_t chunk_hidden = kCombinedChunkHidden,
                                UnitPack* pack = nullptr);

// The non-empty units of counts split among `threads` threads, or all in one list when there are
// fewer than two per thread.
std::vector<std::vector<size_t>> split_units(const std::vector<int64_t>& counts, int threads);

}  // namespace mf
