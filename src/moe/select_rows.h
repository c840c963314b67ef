// Two small selections of routing on the CPU in one pass each, with LibTorch's ops kept for other
// devices and dtypes (and as the tests' references):
// - top_k_index: the k largest scores of each token, where at::topk spent 2.9 ms of the finer MoE
//   shape's 148 ms step (T 4096, E 128, k 8) and 7.4 of 340 at E 256, k 32 (bit by bit on integer
//   keys without a branch on the scores from k 16, or E 32 with AVX2: 1.45 and 0.45 ms now);
// - unit_order: a stable sort of the pairs by unit as a counting sort, where the comparison sort
//   spent 2.0 and 9.4 ms (docs/benchmarks.md).
#pragma once
#include <ATen/ATen.h>

namespace mf {

// index_TK [T, K] int64: per row of scores_TE [T, E], the columns of the K largest scores, largest
// first; equal scores in column order; NaN above every number (as at::topk ranks it).
at::Tensor top_k_index(const at::Tensor& scores_TE, int64_t K);

// order_P [P] int64: the pairs sorted by unit_P (int64 in [0, U)), pairs of one unit in pair order
// (= the indices of unit_P.sort(stable=true)); an out-of-range unit is an error that names it.
at::Tensor unit_order(const at::Tensor& unit_P, int64_t U);

}  // namespace mf
