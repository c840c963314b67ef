// The combine step of dispatch: y[t] = sum over pairs p with token_P[p] = t of weight_P[p] * out_PD[p].
// One pass over the pair outputs on the CPU (no scaled [P, D] temporary, no separate scatter);
// other devices take the same math through generic tensor ops.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// out_PD [P, D], token_P [P] int64 in [0, T), weight_P [P] (out_PD's dtype) -> y_TD [T, D];
// differentiable in out_PD and weight_P:
//   d_out[p] = weight[p] * dy[token[p]],   d_weight[p] = <out[p], dy[token[p]]>
at::Tensor combine(const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P, int64_t T);

}  // namespace mf
