#include "core/row_kernel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/bf16_lanes.h"

namespace mf {
namespace {

// The row kernel over GCC vectors of W floats: a tile of RM rows of x by RN rows of w keeps
// RM x RN accumulators (the dot products' partial sums, one lane per k mod W), RN widened weight
// vectors and one x vector in registers: 16 + 4 + 1 of AVX-512's 32 zmm (RM = 4), 8 + 4 + 1 of
// AVX2's or SSE's 16 (RM = 2; AVX2 with bf16 weights from 4 rows on 4 x 2, rows_avx2); one x row (two
// on AVX-512) takes tiles of 8 weight rows (rows_body).

// W weights from number i of w on as float32 lanes: bf16 bit patterns widened, float32 loaded as
// they are, int8 times their block's scale (W divides 32 and i is a multiple of W: one block)
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec weight_lanes(const uint16_t* w, int64_t i) {
  return widen_lanes<W>(w + i);
}
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec weight_lanes(const float* w, int64_t i) {
  return *reinterpret_cast<const typename Bf16Lanes<W>::Vec*>(w + i);
}
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec weight_lanes(const Q8Rows& w, int64_t i) {
  using L = Bf16Lanes<W>;  // through int16: GCC 12 widened int8 straight to int32 lane by lane
  const auto shorts = __builtin_convertvector(*reinterpret_cast<const typename L::Bytes*>(w.q + i), typename L::Shorts);
  const auto v = __builtin_convertvector(__builtin_convertvector(shorts, typename L::Ints), typename L::Vec);
  return v * w.scale[static_cast<uint64_t>(i) / kQ8Block];
}

// int8 weights a chunk of 4W numbers at a time: read as W 32-bit words of 4 numbers, number j of
// word l (number 4l + j of the chunk) brought to the word's low end with its sign by two shifts,
// then converted and scaled; x laid out to match (chunked_x): 3-4 instructions per W weights
// where converting W bytes took 9 (AVX-512) and GCC does not give us vpmovsxbd from vectors.
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec chunk_scales(const Q8Rows& w, int64_t i) {
  using Vec = typename Bf16Lanes<W>::Vec;
  const float* s = w.scale + static_cast<uint64_t>(i) / kQ8Block;
  if constexpr (W == 16) {  // 64 numbers: words 0-7 in one block, 8-15 in the next
    const Vec lo = Vec{} + s[0], hi = Vec{} + s[1];
    return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31);
  } else {
    return Vec{} + s[0];
  }
}

// x [M, K] (rows ldx apart) with every whole chunk of 4W numbers reordered to x[4l + j] at j W + l
// (the rest as it is), into a buffer of this thread: [M, K]
template <int W>
MF_ALWAYS_INLINE const float* chunked_x(const float* x, int64_t ldx, int64_t M, int64_t K) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(M * K));
  constexpr int C = 4 * W;
  for (int64_t m = 0; m < M; ++m) {
    const float* from = x + m * ldx;
    float* to = buf.data() + m * K;
    int64_t c = 0;
    for (; c + C <= K; c += C)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < W; ++l) to[c + j * W + l] = from[c + 4 * l + j];
    std::copy(from + c, from + K, to + c);
  }
  return buf.data();
}

// acc[m][n] += the whole chunks of x (chunked_x) times w's rows at + n ldw; returns where they end
template <int W, int RM, int RN, bool Ahead>
MF_ALWAYS_INLINE int64_t q8_chunks(typename Bf16Lanes<W>::Vec (&acc)[RM][RN], const float* x, int64_t ldx, int64_t K,
                                   const Q8Rows& w, int64_t at, int64_t ldw, int64_t next) {
  using L = Bf16Lanes<W>;
  using Vec = typename L::Vec;
  constexpr int C = 4 * W;
  int64_t k = 0;
  for (; k + C <= K; k += C) {
    typename L::Words raw[RN];
    Vec scale[RN];
    for (int n = 0; n < RN; ++n) {
      if constexpr (Ahead) __builtin_prefetch(w.q + at + next + n * ldw + k);
      raw[n] = *reinterpret_cast<const typename L::Words*>(w.q + at + n * ldw + k);
      scale[n] = chunk_scales<W>(w, at + n * ldw + k);
    }
    for (int j = 0; j < 4; ++j) {
      Vec wj[RN];
      for (int n = 0; n < RN; ++n) wj[n] = __builtin_convertvector((raw[n] << (24 - 8 * j)) >> 24, Vec) * scale[n];
      for (int m = 0; m < RM; ++m) {
        const Vec xk = *reinterpret_cast<const Vec*>(x + m * ldx + k + j * W);
        for (int n = 0; n < RN; ++n) acc[m][n] += xk * wj[n];
      }
    }
  }
  return k;
}
MF_ALWAYS_INLINE void prefetch_weights(const float* w, int64_t i) { __builtin_prefetch(w + i); }
MF_ALWAYS_INLINE void prefetch_weights(const uint16_t* w, int64_t i) { __builtin_prefetch(w + i); }
MF_ALWAYS_INLINE void prefetch_weights(const Q8Rows& w, int64_t i) { __builtin_prefetch(w.q + i); }
MF_ALWAYS_INLINE float weight_value(const float* w, int64_t i) { return w[i]; }
MF_ALWAYS_INLINE float weight_value(const uint16_t* w, int64_t i) { return bf16_value(w[i]); }
MF_ALWAYS_INLINE float weight_value(const Q8Rows& w, int64_t i) {
  return static_cast<float>(w.q[i]) * w.scale[static_cast<uint64_t>(i) / kQ8Block];
}

// Horizontal sums by halving: a vector of W lanes read as W / G groups of G lanes. fold(a, b)
// adds each group's two halves, a's groups then b's: W / G groups of G / 2 lanes each from a and
// from b. Lane o of the result takes half-group o / (G / 2) at offset o % (G / 2).
constexpr int fold_lane(int o, int W, int G) {
  const int half = G / 2, groups = W / G, j = o / half;
  return (j >= groups ? W : 0) + j % groups * G + o % half;
}
template <int W, int G, class Vec, size_t... O>
MF_ALWAYS_INLINE Vec fold(Vec a, Vec b, std::index_sequence<O...>) {
  return __builtin_shufflevector(a, b, fold_lane(O, W, G)...) +
         __builtin_shufflevector(a, b, (fold_lane(O, W, G) + G / 2)...);
}
template <int W, int G, class Vec>
MF_ALWAYS_INLINE Vec fold(Vec a, Vec b) {
  return fold<W, G>(a, b, std::make_index_sequence<W>{});
}

// lane n of the result: the sum of the W lanes of v[n], n < R (R a power of two, R <= W). A
// tile's dot products end here: the in-order sum of each vector's lanes was a chain of W
// dependent adds per row, and at short K (a decode step's down product, K = 288) it kept the
// next tile's loads waiting (30 against 44 GB/s).
template <int W, int R, int G = W, class Vec>
MF_ALWAYS_INLINE Vec lane_sums(const Vec (&v)[R]) {
  if constexpr (R > 1) {
    Vec half[R / 2];
    for (int r = 0; r < R / 2; ++r) half[r] = fold<W, G>(v[2 * r], v[2 * r + 1]);
    return lane_sums<W, R / 2, G / 2>(half);
  } else if constexpr (G > 1) {
    const Vec once[1] = {fold<W, G>(v[0], v[0])};
    return lane_sums<W, 1, G / 2>(once);
  } else {
    return v[0];
  }
}

// y[m * ldy + n * step] = sum_k x[m * ldx + k] w(at + n * ldw + k) for m < RM, n < RN; Ahead: the
// next tile's weight rows (from at + next on, ldw apart) prefetched along the way
template <int W, int RM, int RN, bool Ahead, class P>
MF_ALWAYS_INLINE void rows_tile(const float* x, int64_t ldx, int64_t K, const P& w, int64_t at, int64_t ldw,
                                int64_t next, float* y, int64_t ldy, int64_t step) {
  using Vec = typename Bf16Lanes<W>::Vec;
  Vec acc[RM][RN];
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) acc[m][n] = Vec{};
  int64_t k = 0;
  if constexpr (std::is_same_v<P, Q8Rows>) k = q8_chunks<W, RM, RN, Ahead>(acc, x, ldx, K, w, at, ldw, next);
  for (; k + W <= K; k += W) {
    Vec wk[RN];
    if constexpr (Ahead)
      for (int n = 0; n < RN; ++n) prefetch_weights(w, at + next + n * ldw + k);
    for (int n = 0; n < RN; ++n) wk[n] = weight_lanes<W>(w, at + n * ldw + k);
    for (int m = 0; m < RM; ++m) {
      const Vec xk = *reinterpret_cast<const Vec*>(x + m * ldx + k);
      for (int n = 0; n < RN; ++n) acc[m][n] += xk * wk[n];
    }
  }
  for (int m = 0; m < RM; ++m) {
    const Vec sums = lane_sums<W, RN>(acc[m]);
    for (int n = 0; n < RN; ++n) {
      float s = sums[n];
      for (int64_t j = k; j < K; ++j) s += x[m * ldx + j] * weight_value(w, at + n * ldw + j);
      y[m * ldy + n * step] = s;
    }
  }
}

// Tiles of rows n0 + t + j S (j < RN, S = (n1 - n0) / RN) are taken from kStridedBytes of weights
// on for one or two x rows, where a tile of neighbouring rows would end each weight stream every RN
// rows: each stream runs on through consecutive rows. One-row products, 2 threads, 460 MB of
// weights: rows of 288 numbers 38-45 -> 49-54 GB/s, of 1024 41-52 -> 49-55 (docs/benchmarks.md);
// the 64-expert model's decode step (in-process rounds) float32 0.91-0.92x the time, bf16 0.92x,
// int8 0.98x; the quickstart's, whose weights the cache holds, 1.01-1.10x, where strided tiles for
// every product took 1.07-1.18x; the AVX2 variant (MOEFORGE_SIMD=avx2) 0.84x, bf16 0.85x, int8
// 1.03x, the quickstart 0.96x. At 4 and 8 x rows (batch 4 and 8): 1.00x and 0.96-0.98x, the
// quickstart's 1.035x: not taken there.
constexpr int64_t kStridedBytes = int64_t{512} << 10;
template <class P>
constexpr int64_t weight_size = std::is_same_v<P, const float*>      ? 4
                                : std::is_same_v<P, const uint16_t*> ? 2
                                                                     : 1;

// rows [n0, n1) of w against every row of x: tiles of RN weight rows, neighbouring or with `strided`
// (n1 - n0) / RN apart, RM x rows at a time; returns where the whole tiles end
template <int W, int RM, int RN, class P>
MF_ALWAYS_INLINE int64_t rows_tiles(const float* x, int64_t ldx, int64_t M, int64_t K, const P& w, int64_t ldw,
                                    int64_t n0, int64_t n1, float* y, int64_t ldy, bool strided = false) {
  const int64_t tiles = (n1 - n0) / RN, apart = strided ? tiles : 1;
  const int64_t row = apart * ldw, next = strided ? ldw : RN * ldw;  // a tile's rows apart; the next tile's first
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = n0 + (strided ? t : t * RN), at = n * ldw;
    int64_t m = 0;  // the first tile prefetches the next weight rows, unless x is one row (it waits on memory anyway)
    if constexpr (RM > 1)
      if (M >= RM) rows_tile<W, RM, RN, true>(x, ldx, K, w, at, row, next, y + n, ldy, apart), m = RM;
    for (; m + RM <= M; m += RM)
      rows_tile<W, RM, RN, false>(x + m * ldx, ldx, K, w, at, row, next, y + m * ldy + n, ldy, apart);
    if (m == 0 && M > 1) rows_tile<W, 1, RN, true>(x, ldx, K, w, at, row, next, y + n, ldy, apart), m = 1;
    for (; m < M; ++m) rows_tile<W, 1, RN, false>(x + m * ldx, ldx, K, w, at, row, next, y + m * ldy + n, ldy, apart);
  }
  return n0 + tiles * RN;
}

// rows [n0, n1) of w against every row of x. One or two x rows (a decode step's products) wait on
// memory, not arithmetic: tiles of 8 weight rows keep 8 streams in flight (f32 64-expert model, batch 1,
// 2 threads: down products at K = 288 from 37 to 44 GB/s; bf16 and int8 gained more). Baseline x86
// (W = 4) keeps tiles of 4: lane_sums takes at most W vectors.
template <int W, int RM, int RN, class P>
MF_ALWAYS_INLINE void rows_body(const float* x, int64_t ldx, int64_t M, int64_t K, const P& w, int64_t ldw, int64_t n0,
                                int64_t n1, float* y, int64_t ldy) {
  if constexpr (std::is_same_v<P, Q8Rows>) x = chunked_x<W>(x, ldx, M, K), ldx = K;
  int64_t n = n0;
  constexpr int few = W >= 16 ? 2 : 1;  // x rows a tile of 8 weight rows takes: 16 accumulators of 32 zmm, 8 of 16 ymm
  const bool large = (n1 - n0) * K * weight_size<P> >= kStridedBytes;
  if constexpr (W >= 8)
    if (M <= few) n = rows_tiles<W, few, 8>(x, ldx, M, K, w, ldw, n, n1, y, ldy, large);
  n = rows_tiles<W, RM, RN>(x, ldx, M, K, w, ldw, n, n1, y, ldy);
  rows_tiles<W, 1, 1>(x, ldx, M, K, w, ldw, n, n1, y, ldy);
}

#define MF_ROWS_PARAMS \
  (const float* x, int64_t ldx, int64_t M, int64_t K, P w, int64_t ldw, int64_t n0, int64_t n1, float* y, int64_t ldy)
#define MF_ROWS_ARGS (x, ldx, M, K, w, ldw, n0, n1, y, ldy)
#if defined(__x86_64__) && defined(__GNUC__)
template <class P>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void rows_avx512 MF_ROWS_PARAMS {
  rows_body<16, 4, 4> MF_ROWS_ARGS;
}
// bf16 weights from 4 x rows on: tiles of 4 x rows by 2 weight rows, each widened weight vector used
// 4 times, not 2 (one thread, K 2048, N 6144: 64 rows 34 -> 23 ms, 8 rows 4.2 -> 2.9). Not for 2 or
// 3 rows left over (they run one by one: 6 and 7 rows 5-7 % slower), nor for float32 or int8 weights
// (no gain).
template <class P>
__attribute__((target("avx2,fma"))) void rows_avx2 MF_ROWS_PARAMS {
  if constexpr (std::is_same_v<P, const uint16_t*>)
    if (M >= 4 && M % 4 < 2) return rows_body<8, 4, 2> MF_ROWS_ARGS;
  rows_body<8, 2, 4> MF_ROWS_ARGS;
}
#endif
template <class P>
void rows_base MF_ROWS_PARAMS {
  rows_body<4, 2, 4> MF_ROWS_ARGS;
}

template <class P>
void rows_range MF_ROWS_PARAMS {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return rows_avx512 MF_ROWS_ARGS;
    case SimdLevel::Avx2: return rows_avx2 MF_ROWS_ARGS;
    default: break;
  }
#endif
  rows_base MF_ROWS_ARGS;
}
#undef MF_ROWS_ARGS
#undef MF_ROWS_PARAMS

// y = x w^T with threads splitting the rows of w
template <class P>
void rows_parallel(const float* x, int64_t ldx, int64_t M, int64_t K, P w, int64_t ldw, int64_t N, float* y,
                   int64_t ldy) {
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 15) / std::max<int64_t>(K, 1) / 4 * 4);
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { rows_range(x, ldx, M, K, w, ldw, n0, n1, y, ldy); });
}
}  // namespace

void bf16_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t ldw, int64_t N, float* y,
               int64_t ldy) {
  rows_parallel(x, ldx, M, K, w, ldw, N, y, ldy);
}

void f32_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t ldw, int64_t N, float* y,
              int64_t ldy) {
  rows_parallel(x, ldx, M, K, w, ldw, N, y, ldy);
}

void q8_rows(const float* x, int64_t ldx, int64_t M, int64_t K, Q8Rows w, int64_t ldw, int64_t N, float* y,
             int64_t ldy) {
  rows_parallel(x, ldx, M, K, w, ldw, N, y, ldy);
}

void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* w, int64_t ldw, int64_t n0,
               int64_t n1, float* y, int64_t ldy) {
  rows_range(x, ldx, M, K, w, ldw, n0, n1, y, ldy);
}

void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t ldw, int64_t n0, int64_t n1,
               float* y, int64_t ldy) {
  rows_range(x, ldx, M, K, w, ldw, n0, n1, y, ldy);
}

void rows_part(const float* x, int64_t ldx, int64_t M, int64_t K, Q8Rows w, int64_t ldw, int64_t n0, int64_t n1,
               float* y, int64_t ldy) {
  rows_range(x, ldx, M, K, w, ldw, n0, n1, y, ldy);
}

}  // namespace mf
