// SwiGLU's elementwise work in a unit's chunk as one pass over its rows (moe/combined_ffn.cpp):
// LibTorch's ops took ~11 calls and as many [n, M] temporaries for the same arithmetic.
// h_PN holds [G | U] (N = 2M columns), every matrix row-major and contiguous.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// a = silu(G) * U  -> a_PM
void swiglu_forward_rows(const at::Tensor& h_PN, at::Tensor& a_PM);

// The backward of y = sum_p w_p (silu(G_p) * U_p) W2^T for a chunk, given gw_PM = dy[token] W2
// (the pair's upstream gradient through W2, not yet weighted) and the pair weights w_P:
//   A = silu(G) * U (recomputed),  dweight_p = sum_c A_pc gw_pc,  dA = w_p gw_p,
//   dG = dA * U * s (1 + G (1 - s)) with s = sigmoid(G),  dU = dA * silu(G)
// -> dweight_P, wa_PM = w_p A_p (for dW2 = dy[token]^T (w A)) and dh_PN = [dG | dU].
void swiglu_backward_rows(const at::Tensor& h_PN, const at::Tensor& gw_PM, const at::Tensor& w_P, at::Tensor& dweight_P,
                          at::Tensor& wa_PM, at::Tensor& dh_PN);

}  // namespace mf
