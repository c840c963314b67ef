// A unit chunk's elementwise work as one pass over its rows (moe/combined_ffn.cpp): LibTorch's ops
// took ~11 calls and as many [n, M] temporaries for the same arithmetic. h_PN holds the
// pre-activations H: [G | U] for SwiGLU (N = 2M columns), H itself for GELU (N = M); every matrix
// row-major and contiguous, float32 or float64 on the CPU.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// A = silu(G) * U (SwiGLU) or gelu(H) = H Phi(H) (GELU, exact)  -> a_PM
void activation_forward_rows(const at::Tensor& h_PN, at::Tensor& a_PM, bool swiglu);

// The backward of y = sum_p w_p A_p W2^T for a chunk, given gw_PM = dy[token] W2 (the pair's
// upstream gradient through W2, not yet weighted) and the pair weights w_P:
//   A recomputed,  dweight_p = sum_c A_pc gw_pc,  dA = w_p gw_p,  wa = w_p A_p (for dW2)
//   SwiGLU: dG = dA * U * s (1 + G (1 - s)) with s = sigmoid(G),  dU = dA * silu(G)
//   GELU:   dH = dA * (Phi(H) + H phi(H))
// -> dweight_P, wa_PM and dh_PN.
void activation_backward_rows(const at::Tensor& h_PN, const at::Tensor& gw_PM, const at::Tensor& w_P,
                              at::Tensor& dweight_P, at::Tensor& wa_PM, at::Tensor& dh_PN, bool swiglu);

// The same on float32 rows by pointer (moe/combined_tiles.cpp: a chunk's scratch, no tensor a call)
void activation_forward_rows(const float* h_PN, float* a_PM, int64_t P, int64_t M, bool swiglu);
void activation_backward_rows(const float* h_PN, const float* gw_PM, const float* w_P, float* dweight_P, float* wa_PM,
                              float* dh_PN, int64_t P, int64_t M, bool swiglu);

}  // namespace mf
