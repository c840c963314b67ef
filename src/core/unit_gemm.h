// The training path's unit GEMMs (moe/combined_ffn.cpp) on our own register tiles (core/tiles.h):
//   out[r][c] = (accumulate ? out[r][c] : 0) + scale[r] * (sum_k a(r, k) b(k, c) + bias[c])
// for r < rows, c < cols, k < depth, every operand reached through row pointers. A gather of x's
// or dy's rows then happens in the loads and a weighted combine into y's or dx's rows in the
// stores, and either operand can be read transposed, so none of a unit's six products copies
// its rows first. B is packed panel by panel (up to 48 columns x depth, zero past cols) and
// stays in L1/L2 while every R-row tile of A runs over it; A is read in place, except that AVX2
// and baseline pack A read by depth (a weight gradient: A^T's rows) in strips of R rows, 256
// depths x 192 rows at a time (one thread on an AVX2-only AMD EPYC: 0.6-0.7x -> 0.85-0.93x
// OpenBLAS's sgemm; AVX-512 reads it in place at 1.7-1.8x OpenBLAS's Haswell kernels).
//
// On an AVX-512 machine these ran 1.6-2x OpenBLAS's Haswell kernels plus our combine
// (docs/benchmarks.md); the AVX2 and baseline variants exist for the tests and for pinning
// (force_unit_gemm), and are not taken unasked (AVX2-only AMD EPYC, 2026-12-06, medians of 5: the
// MoE layer on them 0.88 / 0.80 / 0.68x dense, coarse / fine / finer, against 0.96 / 0.83 / 0.72x
// on OpenBLAS).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace mf {

struct UnitGemm {
  int64_t rows = 0, cols = 0, depth = 0;
  const float* const* a = nullptr;  // a(r, k) = a[r][k], or a[k][r] when a_by_depth
  bool a_by_depth = false;
  const float* const* b = nullptr;  // b(k, c) = b[k][c], or b[c][k] when b_by_col
  bool b_by_col = false;
  float* const* out = nullptr;   // out[r]: row r of the result (cols floats)
  const float* scale = nullptr;  // one per row, or none (1)
  bool accumulate = false;
  const float* bias = nullptr;  // one per column, or none (0)
};

// floats of workspace unit_gemm needs for this depth: one packed panel of B, and on AVX2 and
// baseline at least room for a depth block's panel and A's packed strips (about 240 KB)
int64_t unit_gemm_workspace(int64_t depth);
void unit_gemm(const UnitGemm& g, float* workspace);

// Whether the combined training path runs its units on unit_gemm for x: float32 on the CPU, and
// unless pinned, AVX-512 and the units spread over the threads (each unit_gemm runs on one
// thread; with fewer units than that OpenBLAS's threads share each product instead).
// force_unit_gemm(true / false) pins the choice, nullopt unpins.
bool unit_gemm_preferred(const at::Tensor& x_TD, bool units_on_every_thread = true);
void force_unit_gemm(std::optional<bool> on);

}  // namespace mf
