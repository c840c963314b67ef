// `moeforge bench moe`: forward+backward time of the MoE layer (its training path, the combined
// units of moe/combined_ffn.h, and the grouped path beside it) against a dense SwiGLU with the
// same active FLOPs (the practical ceiling) and the Hugging Face style per-expert Python loop
// (bench/peers/hf_moe_loop.py with python3-torch), in the same and in the default environment.
#pragma once
#include <string>
#include <vector>

#include "core/table.h"

namespace mf {

struct MoEBenchShape {
  std::string name;
  int64_t T, d, E, k, F;
  double flops() const { return 18.0 * static_cast<double>(T * k * d * F); }  // fwd + bwd of the active experts
};
// coarse, fine, finer, all (those three) or scaling (E = 8..256 at fixed k F = 1024, k = E / 8)
std::vector<MoEBenchShape> moe_bench_shapes(const std::string& which);

// Per shape, the MoE layer and the dense layer timed in `iters` rounds, one pass each per round after
// two untimed rounds (core/timing.h's round_seconds), then the reference rows (the other products,
// the grouped path, the dense layer on LibTorch's products, the peer) best of `iters` each. Rows:
// shape, impl, seconds (the best), rounds_seconds (the pair), tokens_per_s, gflops, vs_dense: for the
// MoE layer the median over rounds of the dense layer's time over its own in the same round, for
// the others best against best; or a note where a peer did not run.
ResultTable bench_moe(const std::vector<MoEBenchShape>& shapes, int iters, int threads, const std::string& peer);

}  // namespace mf
