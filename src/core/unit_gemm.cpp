#include "core/unit_gemm.h"

#include <algorithm>
#include <atomic>

#include "core/simd.h"
#include "core/tiles.h"

namespace mf {
namespace {

constexpr int64_t kPanelFloats = 48;  // the widest panel: 3 AVX-512 vectors

std::atomic<int> forced_unit_gemm{-1};

// buf[k][j] = b(k, col + j) for j < width (a whole number of W vectors; 0 past cols): B's panel in
// the order the tile reads it. Read by columns, B is transposed W depths at a time: one vector of
// each column's row, then its W numbers into W rows of the panel.
template <int W>
MF_ALWAYS_INLINE void pack_panel(const UnitGemm& g, int64_t col, int64_t width, float* buf) {
  using Vec = typename tiles::Lanes<W>::Vec;
  const int64_t n = std::min(width, g.cols - col);
  if (g.b_by_col) {
    int64_t k0 = 0;
    for (; k0 + W <= g.depth; k0 += W)
      for (int64_t j = 0; j < width; ++j) {
        const Vec v = j < n ? tiles::load<W>(g.b[col + j] + k0) : Vec{};
        for (int i = 0; i < W; ++i) buf[(k0 + i) * width + j] = v[i];
      }
    for (int64_t k = k0; k < g.depth; ++k)
      for (int64_t j = 0; j < width; ++j) buf[k * width + j] = j < n ? g.b[col + j][k] : 0.0f;
    return;
  }
  const int64_t whole = n / W * W;
  constexpr int64_t ahead = 8;  // rows prefetched ahead: gathered rows of x or dy miss the caches
  for (int64_t k = 0; k < g.depth; ++k) {
    if (k + ahead < g.depth)
      for (int64_t j = 0; j < n; j += 16) __builtin_prefetch(g.b[k + ahead] + col + j);
    const float* bk = g.b[k] + col;
    float* dst = buf + k * width;
    for (int64_t j = 0; j < whole; j += W) tiles::store<W>(dst + j, tiles::load<W>(bk + j));
    for (int64_t j = whole; j < n; ++j) dst[j] = bk[j];
    for (int64_t j = n; j < width; ++j) dst[j] = 0.0f;
  }
}

// rows r0 .. r0 + R of C at columns [col, col + NV W) from the packed panel
template <int W, int R, int NV>
MF_ALWAYS_INLINE void panel_rows(const UnitGemm& g, int64_t r0, int64_t col, const float* buf) {
  using Vec = typename tiles::Lanes<W>::Vec;
  // the output rows (scattered tokens' rows of y or dx) on their way in while the tile computes
  for (int r = 0; r < R && r0 + r < g.rows; ++r)
    for (int64_t c = 0; c < NV * W && col + c < g.cols; c += 16) __builtin_prefetch(g.out[r0 + r] + col + c, 1);
  Vec acc[R][NV];
  if (g.a_by_depth) {
    int64_t off[R];
    for (int r = 0; r < R; ++r) off[r] = std::min<int64_t>(r0 + r, g.rows - 1);  // the last row repeated past the end
    tiles::tile_by_depth<W, R, NV>(g.a, off, g.depth, buf, NV * W, acc);
  } else {
    const float* a[R];
    for (int r = 0; r < R; ++r) a[r] = g.a[std::min<int64_t>(r0 + r, g.rows - 1)];
    tiles::tile<W, R, NV>(a, g.depth, buf, NV * W, acc);
  }
  for (int r = 0; r < R && r0 + r < g.rows; ++r) {
    float* o = g.out[r0 + r] + col;
    const float s = g.scale ? g.scale[r0 + r] : 1.0f;
    for (int v = 0; v < NV; ++v) {
      const int64_t c = v * W;
      if (col + c + W <= g.cols) {
        const Vec val = s * (g.bias ? acc[r][v] + tiles::load<W>(g.bias + col + c) : acc[r][v]);
        tiles::store<W>(o + c, g.accumulate ? tiles::load<W>(o + c) + val : val);
      } else {
        for (int64_t i = 0; col + c + i < g.cols; ++i)
          o[c + i] = (g.accumulate ? o[c + i] : 0.0f) + s * (acc[r][v][i] + (g.bias ? g.bias[col + c + i] : 0.0f));
      }
    }
  }
}

template <int W, int R, int NV>
MF_ALWAYS_INLINE void panel(const UnitGemm& g, int64_t col, const float* buf) {
  for (int64_t r0 = 0; r0 < g.rows; r0 += R) panel_rows<W, R, NV>(g, r0, col, buf);
}

// C in panels of up to P vectors, the vectors spread evenly (4 vectors: 2 + 2, not 3 + 1: a
// one-vector panel does one FMA per broadcast)
template <int W, int R, int P>
MF_ALWAYS_INLINE void unit_gemm_body(const UnitGemm& g, float* buf) {
  const int64_t vecs = (g.cols + W - 1) / W, panels = (vecs + P - 1) / P;
  int64_t v0 = 0;
  for (int64_t i = 0; i < panels; ++i) {
    const int64_t nv = vecs / panels + (i < vecs % panels ? 1 : 0), col = v0 * W;
    pack_panel<W>(g, col, nv * W, buf);
    if constexpr (P >= 3)
      if (nv == 3) panel<W, R, 3>(g, col, buf);
    if (nv == 2) panel<W, R, 2>(g, col, buf);
    if (nv == 1) panel<W, R, 1>(g, col, buf);
    v0 += nv;
  }
}

#define MF_UNIT_GEMM_PARAMS (const UnitGemm& g, float* buf)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void unit_gemm_avx512 MF_UNIT_GEMM_PARAMS {
  unit_gemm_body<16, 8, 3>(g, buf);
}
__attribute__((target("avx2,fma"))) void unit_gemm_avx2 MF_UNIT_GEMM_PARAMS { unit_gemm_body<8, 6, 2>(g, buf); }
#endif
void unit_gemm_base MF_UNIT_GEMM_PARAMS { unit_gemm_body<4, 6, 2>(g, buf); }
#undef MF_UNIT_GEMM_PARAMS

}  // namespace

int64_t unit_gemm_workspace(int64_t depth) { return std::max<int64_t>(depth, 1) * kPanelFloats; }

void unit_gemm(const UnitGemm& g, float* workspace) {
  if (g.rows <= 0 || g.cols <= 0) return;
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return unit_gemm_avx512(g, workspace);
    case SimdLevel::Avx2: return unit_gemm_avx2(g, workspace);
    default: break;
  }
#endif
  unit_gemm_base(g, workspace);
}

bool unit_gemm_preferred(const at::Tensor& x_TD, bool units_on_every_thread) {
  if (!x_TD.is_cpu() || x_TD.scalar_type() != at::kFloat) return false;
  if (const int f = forced_unit_gemm; f >= 0) return f == 1;
  return simd_level() == SimdLevel::Avx512 && units_on_every_thread;
}

void force_unit_gemm(std::optional<bool> on) { forced_unit_gemm = on ? static_cast<int>(*on) : -1; }

}  // namespace mf
