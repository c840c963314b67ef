// Rotary embeddings (model/layers.h, RopeTable::apply) as one pass each way, float32 or float64 on
// the CPU, instead of LibTorch's two narrows, negation, cat, two products and sum and their backward
// nodes (a zero-filled full-size gradient per narrow among them). The output is [B, H, T, D]
// contiguous, the layout the attention kernel reads, so its copy of q and k is gone too.
#pragma once
#include <ATen/ATen.h>

namespace mf {

// x [B, H, T, D] (the last dimension contiguous), cos and sin [T, D] in x's dtype; per row, h = D / 2:
//   y_i = x_i c_i - x_{i+h} s_i,  y_{i+h} = x_{i+h} c_{i+h} + x_i s_{i+h}   (i < h)
// and backward, from g = dL/dy:
//   dx_i = g_i c_i + g_{i+h} s_{i+h},  dx_{i+h} = g_{i+h} c_{i+h} - g_i s_i
at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos_TD, const at::Tensor& sin_TD);

// The same by LibTorch ops (Hugging Face's rotate_half), on any device and dtype: the readable
// reference the kernel is tested against, and the path where it does not apply.
at::Tensor rope_composed(const at::Tensor& x, const at::Tensor& cos_TD, const at::Tensor& sin_TD);

// CPU, float32 or float64, 4-D with an even last dimension
bool rope_rows_applies(const at::Tensor& x);

}  // namespace mf
