#include "core/unit_gemm.h"

#include <algorithm>
#include <atomic>

#include "core/simd.h"
#include "core/tiles.h"

namespace mf {
namespace {

constexpr int64_t kPanelFloats = 64;  // the widest panel: 4 AVX-512 vectors
// A by depth, packed (AVX2 and baseline): a block of A's strips stays in L2 and B's panel, 16 or 8
// columns of kDepthBlock depths, in L1 (Zen 3: 512 KB, 32 KB)
constexpr int64_t kDepthBlock = 256, kRowBlock = 192, kStripFloats = kDepthBlock * kRowBlock;

std::atomic<int> forced_unit_gemm{-1};
// A tile's output rows are prefetched this many tiles ahead: the scattered rows of y or dx come from
// L3 or DRAM, slower than one tile's arithmetic at depth 32-64 (y += A W2^T, E 256 and 128: +5-15 %)
constexpr int64_t kOutAhead = 2;

// The part of the product one pass over B's panels computes: depths [k0, k0 + depth) for C's rows
// [r0, r0 + rows). A is read in place through g.a, or from its strips (pack_strips): a(r0 + i R + j,
// k0 + k) at strips[k][i R depth + j], strips[k] = packed + k R.
struct Block {
  int64_t k0, depth, r0, rows;
  const float* const* strips = nullptr;
};

// buf[k][j] = b(k0 + k, col + j) for j < width (a whole number of W vectors; 0 past cols): B's
// panel in the order the tile reads it. Read by columns, B goes W columns x W depths at a time:
// a vector of each column's row, transposed in registers into W rows of the panel (one number at
// a time it held H = X W1^T back by 5-8 % at the finer shape, two threads).
template <int W>
MF_ALWAYS_INLINE void pack_panel(const UnitGemm& g, const Block& blk, int64_t col, int64_t width, float* buf) {
  using Vec = typename tiles::Lanes<W>::Vec;
  const int64_t n = std::min(width, g.cols - col), depth = blk.depth;
  if (g.b_by_col) {
    int64_t k0 = 0;
    for (; k0 + W <= depth; k0 += W)
      for (int64_t j0 = 0; j0 < width; j0 += W) {
        Vec v[W];
        for (int i = 0; i < W; ++i) v[i] = j0 + i < n ? tiles::load<W>(g.b[col + j0 + i] + blk.k0 + k0) : Vec{};
        tiles::transpose<W>(v);
        for (int i = 0; i < W; ++i) tiles::store<W>(buf + (k0 + i) * width + j0, v[i]);
      }
    for (int64_t k = k0; k < depth; ++k)
      for (int64_t j = 0; j < width; ++j) buf[k * width + j] = j < n ? g.b[col + j][blk.k0 + k] : 0.0f;
    return;
  }
  const int64_t whole = n / W * W;
  const float* const* b = g.b + blk.k0;
  constexpr int64_t ahead = 8;  // rows prefetched ahead: gathered rows of x or dy miss the caches
  for (int64_t k = 0; k < depth; ++k) {
    if (k + ahead < depth)
      for (int64_t j = 0; j < n; j += 16) __builtin_prefetch(b[k + ahead] + col + j);
    const float* bk = b[k] + col;
    float* dst = buf + k * width;
    for (int64_t j = 0; j < whole; j += W) tiles::store<W>(dst + j, tiles::load<W>(bk + j));
    for (int64_t j = whole; j < n; ++j) dst[j] = bk[j];
    for (int64_t j = n; j < width; ++j) dst[j] = 0.0f;
  }
}

// strips[i][k][j] = a(r0 + i R + j, k0 + k), 0 past the block's rows: A read by depth, whose rows
// each give R numbers to every strip (a tile reading A^T in place takes a new cache line per depth)
template <int R>
MF_ALWAYS_INLINE void pack_strips(const UnitGemm& g, const Block& blk, float* strips) {
  const int64_t count = (blk.rows + R - 1) / R;
  for (int64_t k = 0; k < blk.depth; ++k) {
    const float* ak = g.a[blk.k0 + k] + blk.r0;
    for (int64_t i = 0; i < count; ++i) {
      float* dst = strips + (i * blk.depth + k) * R;
      const int64_t n = std::min<int64_t>(R, blk.rows - i * R);
      for (int64_t j = 0; j < n; ++j) dst[j] = ak[i * R + j];
      for (int64_t j = n; j < R; ++j) dst[j] = 0.0f;
    }
  }
}

// out[r0 + r][col + c] = (accumulate ? out : 0) + scale (acc[r][c] + bias[col + c]) for the rows and
// columns of C among the tile's R rows and NV vectors
template <int W, int R, int NV>
MF_ALWAYS_INLINE void store_tile(const UnitGemm& g, int64_t r0, int64_t col,
                                 const typename tiles::Lanes<W>::Vec (&acc)[R][NV], bool accumulate,
                                 const float* bias) {
  using Vec = typename tiles::Lanes<W>::Vec;
  for (int r = 0; r < R && r0 + r < g.rows; ++r) {
    float* o = g.out[r0 + r] + col;
    const float s = g.scale ? g.scale[r0 + r] : 1.0f;
    for (int v = 0; v < NV; ++v) {
      const int64_t c = v * W;
      if (col + c + W <= g.cols) {
        const Vec val = s * (bias ? acc[r][v] + tiles::load<W>(bias + col + c) : acc[r][v]);
        tiles::store<W>(o + c, accumulate ? tiles::load<W>(o + c) + val : val);
      } else {
        for (int64_t i = 0; col + c + i < g.cols; ++i)
          o[c + i] = (accumulate ? o[c + i] : 0.0f) + s * (acc[r][v][i] + (bias ? bias[col + c + i] : 0.0f));
      }
    }
  }
}

// rows r0 .. r0 + R of C (scattered tokens' rows of y or dx) on their way in, those that exist
template <int W, int R, int NV>
MF_ALWAYS_INLINE void prefetch_out(const UnitGemm& g, int64_t r0, int64_t col) {
  for (int r = 0; r < R && r0 + r < g.rows; ++r)
    for (int64_t c = 0; c < NV * W && col + c < g.cols; c += 16) __builtin_prefetch(g.out[r0 + r] + col + c, 1);
}

// rows r0 .. r0 + R of C at columns [col, col + NV W) from the packed panel, A read in place
template <int W, int R, int NV>
MF_ALWAYS_INLINE void panel_rows(const UnitGemm& g, int64_t r0, int64_t col, const float* buf) {
  typename tiles::Lanes<W>::Vec acc[R][NV];
  if (g.a_by_depth) {
    int64_t off[R];
    for (int r = 0; r < R; ++r) off[r] = std::min<int64_t>(r0 + r, g.rows - 1);  // the last row repeated past the end
    tiles::tile_by_depth<W, R, NV>(g.a, off, g.depth, buf, NV * W, acc);
  } else {
    const float* a[R];
    for (int r = 0; r < R; ++r) a[r] = g.a[std::min<int64_t>(r0 + r, g.rows - 1)];
    tiles::tile<W, R, NV>(a, g.depth, buf, NV * W, acc);
  }
  store_tile<W, R, NV>(g, r0, col, acc, g.accumulate, g.bias);
}

// the same from A's packed strip: a later depth block adds to what the earlier ones stored, and
// the bias went in with the first
template <int W, int R, int NV>
MF_ALWAYS_INLINE void strip_rows(const UnitGemm& g, const Block& blk, int64_t r0, int64_t col, const float* buf) {
  typename tiles::Lanes<W>::Vec acc[R][NV];
  int64_t off[R];
  for (int r = 0; r < R; ++r) off[r] = (r0 - blk.r0) * blk.depth + r;
  tiles::tile_by_depth<W, R, NV>(blk.strips, off, blk.depth, buf, NV * W, acc);
  store_tile<W, R, NV>(g, r0, col, acc, g.accumulate || blk.k0 > 0, blk.k0 == 0 ? g.bias : nullptr);
}

template <int W, int R, int NV, bool Strips>
MF_ALWAYS_INLINE void panel(const UnitGemm& g, const Block& blk, int64_t col, const float* buf) {
  for (int64_t r0 = blk.r0; r0 < blk.r0 + kOutAhead * R; r0 += R) prefetch_out<W, R, NV>(g, r0, col);
  for (int64_t r0 = blk.r0; r0 < blk.r0 + blk.rows; r0 += R) {
    prefetch_out<W, R, NV>(g, r0 + kOutAhead * R, col);
    if constexpr (Strips)
      strip_rows<W, R, NV>(g, blk, r0, col, buf);
    else
      panel_rows<W, R, NV>(g, r0, col, buf);
  }
}

// the block over C in panels of up to P vectors, the vectors spread evenly (5 vectors: 3 + 2, not
// 4 + 1: a one-vector panel does one FMA per broadcast). AVX-512 with 4 vectors in all takes one
// panel of 6 rows x 4 vectors: 24 accumulators like 8 x 3, where two panels of 8 x 2 held 16 (the
// finer shape's G = dy W2 and dW2, 64 columns: +7-15 %).
template <int W, int R, int P, bool Strips>
MF_ALWAYS_INLINE void block_product(const UnitGemm& g, const Block& blk, float* buf) {
  const int64_t vecs = (g.cols + W - 1) / W, panels = (vecs + P - 1) / P;
  if constexpr (W == 16 && !Strips)
    if (vecs == 4) {
      pack_panel<W>(g, blk, 0, 4 * W, buf);
      panel<W, 6, 4, Strips>(g, blk, 0, buf);
      return;
    }
  int64_t v0 = 0;
  for (int64_t i = 0; i < panels; ++i) {
    const int64_t nv = vecs / panels + (i < vecs % panels ? 1 : 0), col = v0 * W;
    pack_panel<W>(g, blk, col, nv * W, buf);
    if constexpr (P >= 3)
      if (nv == 3) panel<W, R, 3, Strips>(g, blk, col, buf);
    if (nv == 2) panel<W, R, 2, Strips>(g, blk, col, buf);
    if (nv == 1) panel<W, R, 1, Strips>(g, blk, col, buf);
    v0 += nv;
  }
}

// A read in place: one block
template <int W, int R, int P>
MF_ALWAYS_INLINE void unit_gemm_body(const UnitGemm& g, float* workspace) {
  block_product<W, R, P, false>(g, {0, g.depth, 0, g.rows}, workspace);
}

// A read by depth (a weight gradient), packed: blocks of kDepthBlock depths x kRowBlock rows, each
// block's strips packed once for all of B's panels. A function of its own per level: inlined
// beside the in-place tiles, it left GCC short of registers there (half their speed on AVX2).
template <int W, int R, int P>
MF_ALWAYS_INLINE void packed_by_depth_body(const UnitGemm& g, float* workspace) {
  static_assert(kRowBlock % R == 0);
  const float* strips[kDepthBlock];
  float* packed = workspace + kDepthBlock * kPanelFloats;  // after a block's panel of B
  for (int64_t k = 0; k < kDepthBlock; ++k) strips[k] = packed + k * R;
  for (int64_t k0 = 0; k0 == 0 || k0 < g.depth; k0 += kDepthBlock)  // depth 0: one block stores 0 or bias
    for (int64_t r0 = 0; r0 < g.rows; r0 += kRowBlock) {
      const Block blk{k0, std::min(kDepthBlock, g.depth - k0), r0, std::min(kRowBlock, g.rows - r0), strips};
      pack_strips<R>(g, blk, packed);
      block_product<W, R, P, true>(g, blk, workspace);
    }
}

#define MF_UNIT_GEMM_PARAMS (const UnitGemm& g, float* buf)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void unit_gemm_avx512 MF_UNIT_GEMM_PARAMS {
  unit_gemm_body<16, 8, 3>(g, buf);
}
__attribute__((target("avx2,fma"))) void unit_gemm_avx2 MF_UNIT_GEMM_PARAMS { unit_gemm_body<8, 6, 2>(g, buf); }
__attribute__((target("avx2,fma"))) void packed_by_depth_avx2 MF_UNIT_GEMM_PARAMS {
  packed_by_depth_body<8, 6, 2>(g, buf);
}
#endif
void unit_gemm_base MF_UNIT_GEMM_PARAMS { unit_gemm_body<4, 6, 2>(g, buf); }
void packed_by_depth_base MF_UNIT_GEMM_PARAMS { packed_by_depth_body<4, 6, 2>(g, buf); }
#undef MF_UNIT_GEMM_PARAMS

}  // namespace

int64_t unit_gemm_workspace(int64_t depth) {
  const int64_t panel = std::max<int64_t>(depth, 1) * kPanelFloats;
  // the packed path's panel (at most kDepthBlock deep) and strips; AVX-512 reads A in place
  return simd_level() == SimdLevel::Avx512 ? panel : std::max(panel, kDepthBlock * kPanelFloats + kStripFloats);
}

void unit_gemm(const UnitGemm& g, float* workspace) {
  if (g.rows <= 0 || g.cols <= 0) return;
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return unit_gemm_avx512(g, workspace);
    case SimdLevel::Avx2: return g.a_by_depth ? packed_by_depth_avx2(g, workspace) : unit_gemm_avx2(g, workspace);
    default: break;
  }
#endif
  g.a_by_depth ? packed_by_depth_base(g, workspace) : unit_gemm_base(g, workspace);
}

bool unit_gemm_preferred(const at::Tensor& x_TD, bool units_on_every_thread) {
  if (!x_TD.is_cpu() || x_TD.scalar_type() != at::kFloat) return false;
  if (const int f = forced_unit_gemm; f >= 0) return f == 1;
  return simd_level() == SimdLevel::Avx512 && units_on_every_thread;
}

void force_unit_gemm(std::optional<bool> on) { forced_unit_gemm = on ? static_cast<int>(*on) : -1; }

}  // namespace mf
