// Weights held in bfloat16, computed in float32 (`--dtype bf16`, model/weight_dtype.h).
//
// LibTorch 1.13's CPU kernels are no help here: a bf16 mm runs ATen's generic loop instead of a
// BLAS (Debian's build has no oneDNN), 20-60x slower than float32 (bench bf16 below), and
// RMSNorm, softmax and RoPE would round every activation to 8 bits of mantissa. So activations
// stay float32 and only the large matrices are held in bf16; `project` widens their rows to
// float32 inside the kernel as it reads them (a bf16 number is the top half of a float32), so a
// decoded token reads half the bytes of a float32 weight and every product and sum is float32
// math on the rounded weights.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mf {

// y = x w^T (+ b), w [N, K], x [..., K]: LibTorch's linear, or for a bf16 w with float32 x on
// the CPU outside autograd, the kernel below (any other x: w widened to x's dtype first).
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});
// out = x w^T for x [M, K] into out [M, N] (rows contiguous): the same choice, no allocation
// for a float32 or float64 w.
void project_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);
// Rows `ids` of an embedding table [V, D]: float32 rows when the table is held in bf16.
at::Tensor embed_rows(const at::Tensor& ids, const at::Tensor& table);
// `w` in `dtype` (a view of it when it is already): for reference paths that take float weights.
at::Tensor widened(const at::Tensor& w, at::ScalarType dtype);

// Rows at most this many go through the row kernel; more rows widen w panel by panel into a
// float32 GEMM (prompt processing, evaluation), where the GEMM's blocking wins.
inline constexpr int64_t kBf16KernelRows = 8;

// The kernel: y[m * ldy + n] = sum_k x[m * ldx + k] float(w[n * ldw + k]) for m < M, n < N,
// k < K; w holds bf16 bit patterns. Threads split n (at::parallel_for). Variants for AVX-512,
// AVX2 + FMA and baseline x86-64 (core/simd.h's level).
void bf16_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t ldw, int64_t N, float* y,
               int64_t ldy);

}  // namespace mf
