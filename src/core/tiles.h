// Register tiles shared by our unit GEMMs (moe/fused_units.cpp, core/unit_gemm.cpp): GCC vectors of
// W floats, R rows x NV vectors of accumulators, written once and compiled per instruction set by
// their callers (AVX-512: W 16, R 8, up to 3 vectors: 24 accumulators + 3 weight vectors + a
// broadcast in 32 zmm; AVX2 + FMA and baseline: W 8 or 4, R 6, up to 2). Internal to the kernels.
#pragma once
#include <cstdint>

#include "core/simd.h"

namespace mf::tiles {

template <int W, typename T = float>  // T: float, or double where a kernel also runs the float64 tests
struct Lanes {
  typedef T Vec __attribute__((vector_size(W * sizeof(T)), aligned(sizeof(T)), may_alias));
  typedef int32_t IVec __attribute__((vector_size(W * sizeof(int32_t))));
};

template <int W, typename T>
MF_ALWAYS_INLINE typename Lanes<W, T>::Vec load(const T* p) {
  return *reinterpret_cast<const typename Lanes<W, T>::Vec*>(p);
}
template <int W, typename T>
MF_ALWAYS_INLINE void store(T* p, typename Lanes<W, T>::Vec v) {
  *reinterpret_cast<typename Lanes<W, T>::Vec*>(p) = v;
}
template <int W, typename T = float>
MF_ALWAYS_INLINE typename Lanes<W, T>::Vec splat(T s) {
  return typename Lanes<W, T>::Vec{} + s;
}

// v[i][l] <- v[l][i]: a W x W block transposed in registers, log2(W) rounds of two-input
// shuffles; round S swaps the off-diagonal S x S blocks of every 2S x 2S block
template <int W, int S = 1>
MF_ALWAYS_INLINE void transpose(typename Lanes<W>::Vec (&v)[W]) {
  typename Lanes<W>::IVec lo, hi;
#pragma GCC unroll 16
  for (int l = 0; l < W; ++l) {
    lo[l] = (l & S) ? W + l - S : l;
    hi[l] = (l & S) ? W + l : l + S;
  }
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i)
    if (!(i & S)) {
      const auto a = v[i], b = v[i + S];
      v[i] = __builtin_shuffle(a, b, lo);
      v[i + S] = __builtin_shuffle(a, b, hi);
    }
  if constexpr (2 * S < W) transpose<W, 2 * S>(v);
}

// acc[r][v] = sum_k a[r][k] w[k ldw + v W .. + W)   (a[r]: row r, read through its pointer)
template <int W, int R, int NV, typename T>
MF_ALWAYS_INLINE void tile(const T* const (&a)[R], int64_t K, const T* w, int64_t ldw,
                           typename Lanes<W, T>::Vec (&acc)[R][NV]) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = typename Lanes<W, T>::Vec{};
  for (int64_t k = 0; k < K; ++k) {
    typename Lanes<W, T>::Vec wk[NV];
    for (int v = 0; v < NV; ++v) wk[v] = load<W>(w + k * ldw + v * W);
    for (int r = 0; r < R; ++r) {
      const T s = a[r][k];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * wk[v];
    }
  }
}

// The same with A read by depth: acc[r][v] = sum_k a[k][off[r]] w[k ldw + v W .. + W), where
// a[k] holds row k of A^T (a weight gradient's sum over pairs: A^T is the pairs' rows)
template <int W, int R, int NV, typename T>
MF_ALWAYS_INLINE void tile_by_depth(const T* const* a, const int64_t (&off)[R], int64_t K, const T* w, int64_t ldw,
                                    typename Lanes<W, T>::Vec (&acc)[R][NV]) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = typename Lanes<W, T>::Vec{};
  for (int64_t k = 0; k < K; ++k) {
    typename Lanes<W, T>::Vec wk[NV];
    for (int v = 0; v < NV; ++v) wk[v] = load<W>(w + k * ldw + v * W);
    const T* ak = a[k];
    for (int r = 0; r < R; ++r) {
      const T s = ak[off[r]];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * wk[v];
    }
  }
}

}  // namespace mf::tiles
