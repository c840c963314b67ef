// RMSNorm (model/layers.h) as one pass per row each way, float32 or float64 on the CPU, instead of
// LibTorch's pow, mean, add, rsqrt and two products forward and their six backward nodes (each a
// pass over the activations and a temporary of their size): most of the elementwise time of the
// repro miniatures' steps (d 128, 17 norms a step; docs/benchmarks.md).
#pragma once
#include <ATen/ATen.h>

namespace mf {

// Over the last dimension of x [..., D], per row:
//   r = 1 / sqrt(mean_d x_d^2 + eps),  y_d = x_d r w_d
// and backward, from g = dL/dy (u_d = g_d w_d):
//   dx_d = r u_d - x_d r^3 (sum_j u_j x_j) / D,  dw_d = sum over rows of g_d x_d r
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps);

// The same by LibTorch ops, on any device and dtype: the readable reference the kernel is tested
// against, and the path where the kernel does not apply.
at::Tensor rms_norm_composed(const at::Tensor& x, const at::Tensor& weight, double eps);

// CPU, float32 or float64, x and weight of one dtype, weight [D]
bool rms_norm_rows_applies(const at::Tensor& x, const at::Tensor& weight);

}  // namespace mf
