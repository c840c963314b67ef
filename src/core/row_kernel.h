// The row kernel: y = x w^T for a few rows of x against a weight [N, K] held in float32, bf16 or
// int8 (core/q8.h), every product and sum in float32: the decode engine's matrix-times-rows
// (serve/decode_engine.h) and `project` for bf16 and int8 weights (core/bf16.h). Each output's sum
// runs in one order whatever the rows beside it and the range of outputs a call takes.
#pragma once
#include <cstdint>

#include "core/q8.h"

namespace mf {

// The kernel: y[m * ldy + n] = sum_k x[m * ldx + k] float(w[n * ldw + k]) for m < M, n < N,
// k < K; w holds bf16 bit patterns. Threads split n (at::parallel_for). Variants for AVX-512,
// AVX2 + FMA and baseline x86-64 (core/simd.h's level).
void bf16_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t ldw, int64_t N, float* y,
               int64_t ldy);

// The same kernel on float32 weights: the decode engine's matrix-times-rows (serve/decode_engine.h),
// where a few rows make LibTorch's linear mostly call overhead.
void f32_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t ldw, int64_t N, float* y,
              int64_t ldy);
// ... and on int8 weights (core/q8.h): each weight its int8 number times its block's scale.
void q8_rows(const float* x, int64_t ldx, int64_t M, int64_t K, Q8Rows w, int64_t ldw, int64_t N, float* y,
             int64_t ldy);
// One thread's share of any of them: outputs n0 <= n < n1 only, on the calling thread (callers that split
// the work among their own threads).
void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t ldw, int64_t n0,
               int64_t n1, float* y, int64_t ldy);
void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t ldw, int64_t n0, int64_t n1,
               float* y, int64_t ldy);
void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, Q8Rows w, int64_t ldw, int64_t n0, int64_t n1,
               float* y, int64_t ldy);

}  // namespace mf
