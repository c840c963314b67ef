// Grouped expert FFN with a hand-written backward. Autograd through per-expert slices
// (rows.narrow, weight[e]) materialises a zero-filled full-size gradient per expert
// (E x [N, d] and E x [E, 2F, d]); here every gradient is written once, slice by slice.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace mf {

// rows [N, D] grouped by expert (counts[e] rows each, in order), gate_up [E, 2F, D] (swiglu)
// or [E, F, D] (gelu), down [E, D, F], optional biases gate_up_bias [E, 2F|F], down_bias [E, D]
// (undefined tensors = none) -> [N, D]; differentiable in rows, weights and biases.
at::Tensor grouped_ffn(const at::Tensor& rows, const at::Tensor& gate_up, const at::Tensor& down,
                       const std::vector<int64_t>& counts, bool swiglu, const at::Tensor& gate_up_bias = {},
                       const at::Tensor& down_bias = {});

}  // namespace mf
