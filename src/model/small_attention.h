// Softmax attention on the CPU for short and medium sequences (the ViT's 17 tokens, the LMs'
// windows of 128-512). LibTorch's CPU bmm runs one mm per (batch, head) matrix, each with
// select/as_strided dispatch that costs far more than a 17 x 17 x 24 product (two thirds of a
// ViT step); here one parallel loop over (batch, head) computes scores, softmax and output, and
// a hand-written backward the gradients.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// q [B, H, queries, Dh], k and v [B, Hkv, keys, Dh] (keys >= queries; H a multiple of Hkv: query
// head h reads kv head h / (H / Hkv), grouped-query attention without repeated k and v)
// -> [B, H, queries, Dh], differentiable in q, k, v (dK and dV summed over each kv head's queries):
//   s_ij = q_i . k_j / sqrt(Dh)  (causal: -inf where j > i + keys - queries),  P = softmax_j(s),  o_i = sum_j P_ij v_j
// backward from dO:
//   dP_ij = dO_i . v_j,  dV_j = sum_i P_ij dO_i,  dS_ij = P_ij (dP_ij - sum_l P_il dP_il),
//   dQ_i = sum_j dS_ij k_j / sqrt(Dh),  dK_j = sum_i dS_ij q_i / sqrt(Dh)
at::Tensor small_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal);

// The same from the fused projection's output qkv [B, L, 3, H, Dh] (q, k, v = qkv[:, :, 0..2])
// -> [B, L, H, Dh], read and written in place: no head transposes, one gradient tensor.
at::Tensor small_attention_packed(const at::Tensor& qkv_BL3HDh, bool causal);

// Where small_attention beats the bmm path (LibTorch 1.13's CPU bmm runs one dispatched mm per
// matrix): CPU tensors with up to 64 keys, or up to 512 keys with heads up to 64 wide. bench
// kernels' causal case, forward + backward, 16 x 8 heads of 32: 1.6x at 128 keys, 1.4x at 256,
// 1.2x at 512; at 512 keys 1.06x with heads of 64, 0.98x with heads of 128.
bool small_attention_applies(const at::Tensor& q, int64_t keys);

}  // namespace mf
