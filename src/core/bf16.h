// Weights held in bfloat16, computed in float32 (`--dtype bf16`, model/weight_dtype.h).
//
// Why not LibTorch's own bf16: its linear goes through oneDNN, which rounds the activations to
// bf16 as well (bf16 x bf16 products), and whose speed depends on the CPU (on an AVX-512-BF16 EPYC:
// as fast as core/row_kernel.h at one row, 1.4x faster than float32 at 64 rows; K 2048, N 6144,
// python3-torch 1.13); its bf16 -> float32 copy ran at 0.3 GB/s (82 ms for 12.6 M numbers). So
// activations stay float32 and only the large matrices are held in bf16; `project` widens their
// rows to float32 as it reads them (a bf16 number is the top half of a float32): a decoded token
// reads half the bytes of a float32 weight, and every product and sum is float32 math on the
// rounded weights, equal to the float32 model on those weights up to summation order (tested).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "core/q8.h"

namespace mf {

// y = x w^T (+ b), w [N, K], x [..., K]: core/tiles_linear.h (our unit GEMMs where they are taken,
// else LibTorch's linear), or for a bf16 or int8 (core/q8.h) w with float32 x on the CPU outside
// autograd, core/row_kernel.h's kernel (any other x: w widened to x's dtype first).
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});
// out = x w^T for x [M, K] into out [M, N] (rows contiguous): the same choice, no allocation
// for a float32 or float64 w.
void project_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);
// Rows `ids` of an embedding table [V, D]: float32 rows when the table is held in bf16 or int8.
at::Tensor embed_rows(const at::Tensor& ids, const at::Tensor& table);
// A weight dtype held narrower than float32 and computed in float32: bf16 or int8 (core/q8.h).
bool held_narrow(at::ScalarType dtype);
// Row r of a weight [N, K] in float32, bf16 or int8 as K float32 numbers into out.
void weight_row(const at::Tensor& w, int64_t r, float* out);
// dst.copy_(src), float32 into bf16 by a vectorised rounding (to nearest, ties to even, as LibTorch
// rounds; its own copy ran at 0.14 G numbers/s), into int8 by q8_quantize: loading a model's weights.
void copy_weights(at::Tensor& dst, const at::Tensor& src);
// `w` in `dtype` (itself when it is already, or neither bf16 nor int8): for paths that take float
// weights; bf16 to float32 by the vectorised widening below (LibTorch's copy ran at 0.3 GB/s), int8
// times its scales.
at::Tensor widened(const at::Tensor& w, at::ScalarType dtype);

// Rows at most this many go through the row kernel; more rows widen w panel by panel into a
// float32 GEMM (prompt processing, evaluation). Measured (bench kernels, K 2048, N 6144, 2 threads,
// AVX-512 EPYC; ms, row kernel / panels / float32 linear): 1 row 0.34 / 3.0 / 2.6, 16 rows 2.2 / 4.7 /
// 4.0, 32 rows 3.5 / 7.1 / 5.6, 64 rows 6.5 / 10.9 / 9.2, 128 rows 15.3 / 19.2 / 17.8.
inline constexpr int64_t kBf16KernelRows = 128;

}  // namespace mf
