// The elementwise half of the LM loss (model/fused_loss.cpp) as one pass per row of a chunk of
// logits, in place: LibTorch's logsumexp, gather, sub_, exp_, scatter_add_ and div_ made six
// passes over the [n, V] logits and a temporary of their size (V = 8192 at 2048 tokens: 67 MB).
#pragma once
#include <ATen/ATen.h>

namespace mf {

// For each row z_n of z_nV (contiguous, float32 or float64, CPU) and its target t_n:
//   loss_n = lse_n - z_{n,t_n},  lse_n = log sum_v exp z_{n,v}
//   z_n <- scale * (softmax(z_n) - onehot(t_n))   (dL/dz for L = scale * sum_n loss_n)
// -> loss_n [n]. The kernel takes contiguous float32/float64 CPU logits (targets outside [0, V)
// are an error that names them); any other logits go through cross_entropy_rows_composed_.
at::Tensor cross_entropy_rows_(at::Tensor& z_nV, const at::Tensor& t_n, double scale);

// The same by LibTorch ops, on any device: the readable reference the kernel is tested against.
at::Tensor cross_entropy_rows_composed_(at::Tensor& z_nV, const at::Tensor& t_n, double scale);

}  // namespace mf
