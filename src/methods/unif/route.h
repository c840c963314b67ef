// UniF-MoE routing (../shared/specs/unifmoe.md, arXiv 2608.10392): one router W* = [w_shr, W_g]
// makes three ordered decisions per token, and the layer runs only the (expert, block) units
// they pick. Expert 0 of the bank is the shared expert, experts 1..K the residual ones; unit
// u = expert u / B, block u % B (moe/banks.h ExpertBlocks).
//   alpha(x) = tau + (1 - 2 tau) sigmoid(x . w_shr),  tau = (B - 1) / B^2
//   b(x)     = round(B alpha(x))  (halves up, kept in 1..B-1)
//   I_shr    = the b(x) blocks with the largest u_b = x . mu_b (mu_b: prototype of block b)
//   p        = softmax(x W_g) over the K residual experts, sorted p_1 >= ... >= p_K
//   k(x)     = min{n : p_1 + ... + p_n >= 1 - alpha(x)}
//   y        = alpha E_shr^{I_shr}(x) + sum_{i <= k} p_i E_{q_i}^{I_res}(x)   (not renormalised)
// Shape letters (src/core/shapes.h): G the formulas' B blocks of an expert, Q the formulas' K
// residual experts, J = Q + 1 experts (the shared one first).
#pragma once
#include <ATen/ATen.h>

#include "moe/routing.h"

namespace mf {

struct UniFOptions {
  int64_t blocks = 8;          // B
  double fixed_alpha = 0;      // ablation: alpha = this constant (0 = adaptive alpha(x))
  int64_t residual_top_k = 0;  // ablation: the top-n residual experts (0 = cumulative mass)
  bool prefix_blocks = false;  // ablation: share the first b blocks instead of the prototypes' choice
};

struct UniFRouting {
  Assignment assignment;          // pairs over (K + 1) * B units; weight alpha (shared) or p_q (residual)
  at::Tensor alpha_T;             // with grad through w_shr (none under fixed_alpha)
  at::Tensor probs_TQ;            // softmax over the residual experts, with grad through W_g
  at::Tensor shared_TG;           // bool: block b is shared for token t
  at::Tensor chosen_TQ;           // bool: residual expert j runs for token t
  at::Tensor b_T, k_T, blocks_T;  // int64: shared blocks, residual experts, C_B = b + k (B - b)
  at::Tensor weight_TJ;           // [T, K + 1] combine weight per expert (alpha, then p where chosen): output biases
};

double unif_tau(int64_t blocks);

// logits_TJ = x W*^T (column 0: w_shr); priority_TG = x mu^T (ignored with prefix_blocks).
UniFRouting unif_route(const at::Tensor& logits_TJ, const at::Tensor& priority_TG, const UniFOptions& opt);

// ||W W^T - I||_F for the router weight W = W*^T [K + 1, D] (the paper's ||W*^T W* - I||_F)
at::Tensor unif_diversity_loss(const at::Tensor& weight_JD);

}  // namespace mf
