// The inference kernel of one unit (an expert, or one block of an expert, as in grouped_ffn.h)
// on its pairs (token_p, weight_p):
//   y[token_p] += weight_p * (act(x[token_p] W1^T + b1) W2^T + b2)
// with the gather folded into the up projection's loads (each row is read through its token's
// pointer) and the weighted combine into the down projection's stores: no [P, D] copies of rows
// and outputs, which cost UniF-MoE's narrow blocks (one copy of x per token and block) more than
// their GEMMs' rate made up. Rows go through in chunks of kFusedChunk; each projection runs
// panel by panel (48 output columns, whose weights stay in L2) over 8-row tiles.
//
// The kernel reads the weights transposed and padded to whole vectors (UnitPack), packed once and
// kept until a weight tensor changes (its data pointer, shape or version counter: whoever writes
// weights through their data pointer bumps the version, as fused_adamw and the safetensors reader
// do). OpenBLAS repacks its operands on every call instead.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <vector>

namespace mf {

inline constexpr int64_t kPad = 16;          // widths are padded to whole vectors (AVX-512's, and so AVX2's and SSE's)
inline constexpr int64_t kFusedChunk = 128;  // rows per chunk (the hidden activations stay in L2)

// Unit u = (expert u / blocks, block u % blocks) of gate_up [E, 2F|F, D] and down [E, D, F],
// M = F / blocks channels each, padded: n1 = Mp (GELU) or 2 Mp (SwiGLU: gate at 0, up at Mp)
// with Mp = M rounded up to kPad, and Dp = D rounded up likewise (padding holds zeros).
struct PackedUnits {
  int64_t blocks = 0, D = 0, M = 0, Mp = 0, n1 = 0, Dp = 0;
  bool swiglu = false;
  at::Tensor w1_UDN;  // [U, D, n1]: W1 of each unit, transposed
  at::Tensor b1_UN;   // [U, n1] (zeros without a bias)
  at::Tensor w2_UMD;  // [U, M, Dp]: W2 of each unit, transposed
  at::Tensor b2_ED;   // [E, Dp], or undefined (no output bias, or blocks > 1: the caller adds it)
};

class UnitPack {
 public:
  // The packed weights, repacked when a tensor or the unit layout changed. Float32 only.
  std::shared_ptr<const PackedUnits> get(const at::Tensor& gate_up, const at::Tensor& down,
                                         const at::Tensor& gate_up_bias, const at::Tensor& down_bias, int64_t blocks,
                                         bool swiglu);

 private:
  std::mutex mutex_;
  std::vector<int64_t> key_;
  std::shared_ptr<const PackedUnits> packed_;
};

// Whether the fused kernel can run for x: float32 on the CPU (variants for AVX-512, AVX2 + FMA and
// baseline x86-64, chosen by core/simd.h's level).
bool fused_units_available(const at::Tensor& x_TD);
// Whether dispatch takes it unasked, for pairs spread over units (pairs / units rows a unit): on
// AVX2 + FMA, and on AVX-512 below kFusedRowsMax rows a unit. On an AVX2-only AMD EPYC (Zen 3,
// 2026-12-06) the AVX2 variant ran UniF-MoE's blocks 1.27x and whole experts 1.09x faster than
// gather -> GEMM -> combine with OpenBLAS (bench kernels), and `bench unif`'s UniF-MoE inference
// 17-23 % faster. On AVX-512 the combined path runs core/unit_gemm.h's tiles, which repack the
// weights every call but then go faster (AMD EPYC with AVX-512, 2026-12-07, `bench unif`
// inference, fused vs combined: UniF-MoE 3.4-3.7 vs 4.6-4.9 ms at T 128 (~33 rows a unit),
// 8.7 vs 8.2-9.7 at T 512 (~133), even at T 1024 (~270), 26-31 vs 26-28 at T 2048 (~540),
// 59-61 vs 57 at T 4096 (~1080); `bench kernels` at ~1,100 rows a unit: 58.1 vs 53.2 ms
// blocks, 72.4 vs 66.3 whole experts). The baseline variant (0.31x on Zen 3) runs only when
// pinned (force_units_path).
inline constexpr int64_t kFusedRowsMax = 512;
bool fused_units_preferred(const at::Tensor& x_TD, int64_t pairs = 0, int64_t units = 1);

// Unit u's n pairs (token[0..n), weight[0..n)) added into y [T, D] (float32, contiguous), x [T, D];
// h: scratch of kFusedChunk x n1 floats.
void fused_unit(const PackedUnits& p, int64_t u, const float* x, const int64_t* token, const float* weight, int64_t n,
                float* y, float* h);

}  // namespace mf
