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

}  // namespace mf
