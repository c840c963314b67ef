// The gather and combine steps of dispatch. Combine: y[t] = sum over pairs p with token_P[p] = t of weight_P[p] *
// out_PD[p]. One pass over the pair outputs on the CPU (no scaled [P, D] temporary, no separate scatter); other devices
// take the same math through generic tensor ops.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// out_PD [P, D], token_P [P] int64 in [0, T), weight_P [P] (out_PD's dtype) -> y_TD [T, D];
// differentiable in out_PD and weight_P:
//   d_out[p] = weight[p] * dy[token[p]],   d_weight[p] = <out[p], dy[token[p]]>
at::Tensor combine(const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P, int64_t T);

// y_TD[token_P[p]] += weight_P[p] * out_PD[p] in place, in pair order (no autograd; an undefined
// weight_P = weight 1): moe/combined_ffn.cpp combines one chunk of pairs at a time with it.
void combine_into(at::Tensor& y_TD, const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P);

// rows_PD[p] = x_TD[token_P[p]] into a preallocated contiguous rows_PD (no autograd).
void gather_into(at::Tensor& rows_PD, const at::Tensor& x_TD, const at::Tensor& token_P);

// The gather step, combine's adjoint: rows_PD[p] = x_TD[token_P[p]]; differentiable in x_TD
// (dx[t] = sum over pairs p with token_P[p] = t of drows[p], summed in pair order).
at::Tensor gather_rows(const at::Tensor& x_TD, const at::Tensor& token_P);

}  // namespace mf
