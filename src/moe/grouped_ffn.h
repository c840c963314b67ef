// Grouped expert FFN with a hand-written backward. Autograd through per-expert slices
// (rows.narrow, weight[e]) materialises a zero-filled full-size gradient per expert
// (E x [P, D] and E x [E, 2F, D]); here every gradient is written once, slice by slice.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// rows_PD grouped by expert (counts_E[e] rows each, in order), gate_up_E2FD (swiglu) or
// gate_up_EFD (gelu), down_EDF, optional biases gate_up_bias [E, 2F|F], down_bias [E, D]
// (undefined tensors = none) -> [P, D]; differentiable in rows, weights and biases.
// The per-expert loop needs the counts on the host: one copy of counts_E per call (this is
// the fallback path; a grouped GEMM would take counts_E on the device).
at::Tensor grouped_ffn(const at::Tensor& rows_PD, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                       const at::Tensor& counts_E, bool swiglu, const at::Tensor& gate_up_bias = {},
                       const at::Tensor& down_bias = {});

}  // namespace mf
