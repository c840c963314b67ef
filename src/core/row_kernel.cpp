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
// AVX2's or SSE's 16 (RM = 2); one x row (two on AVX-512) takes tiles of 8 weight rows (rows_body).

// bf16 weights read in 32-bit words of two numbers (Chunk) rather than widened W at a time: the
// AVX2 and baseline kernels' way (rows_body)
struct Bf16Words {
  const uint16_t* p;
};

// W weights from number i of w on as float32 lanes: bf16 bit patterns widened, float32 loaded as
// they are, int8 times their block's scale (W divides 32 and i is a multiple of W: one block)
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec weight_lanes(const uint16_t* w, int64_t i) {
  return widen_lanes<W>(w + i);
}
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec weight_lanes(const Bf16Words& w, int64_t i) {
  return widen_lanes<W>(w.p + i);
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

// bf16 words and int8 weights a chunk of Q W numbers at a time (Q = kParts numbers a 32-bit word: 2
// or 4), read as W words: part j of every word (number Q l + j of the chunk, word l) taken out by shifts
// and masks that stay within 32-bit lanes, with x laid out to match (chunked_x). Widening W bf16
// numbers takes a lane-crossing load and a shift, converting W int8 numbers 9 instructions
// (AVX-512); GCC does not give us vpmovsxbd from vectors.
template <class P>
constexpr int kParts = std::is_same_v<P, Q8Rows>      ? 4
                       : std::is_same_v<P, Bf16Words> ? 2
                                                      : 1;

MF_ALWAYS_INLINE const void* word_address(const Bf16Words& w, int64_t i) { return w.p + i; }
MF_ALWAYS_INLINE const void* word_address(const Q8Rows& w, int64_t i) { return w.q + i; }

// AVX2's int8 chunk is one block read 8 numbers at a time by vpmovsxbd (x in its own order): one
// instruction for what the shifts took 1.75 (one thread from L2, GFLOP/s at 1 / 2 / 8 / 64 rows:
// 31 / 47 / 45 / 48 -> 37 / 57 / 58 / 59; the decode engine's step with MOEFORGE_SIMD=avx2, the
// 64-expert model batch 1 / 8 0.87x / 0.86x, the quickstart 0.92x / 0.92x, a 128-token prompt
// 0.85-0.98x). GCC makes it of a vector conversion lane by lane, and an intrinsic would need a
// target attribute on every function it is inlined through.
template <int W, class P>
constexpr bool kSignExtended = W == 8 && std::is_same_v<P, Q8Rows>;
MF_ALWAYS_INLINE Bf16Lanes<8>::Ints sign_extended(const int8_t* p) {
  Bf16Lanes<8>::Ints v;
#if defined(__x86_64__) && defined(__GNUC__)
  asm("vpmovsxbd %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const int64_t*>(p)));
#else
  v = __builtin_convertvector(*reinterpret_cast<const Bf16Lanes<8>::Bytes*>(p), Bf16Lanes<8>::Ints);
#endif
  return v;
}

// the chunk of W words from number i of w on: its words, and for int8 the scale of each lane's block
// (W 16: words 0-7 in one block of 32 numbers, 8-15 in the next)
template <int W, class P>
struct Chunk {
  using L = Bf16Lanes<W>;
  typename L::Words raw;
  typename L::Vec scale;
  const int8_t* bytes = nullptr;  // AVX2's int8: read by sign_extended
  MF_ALWAYS_INLINE void load(const P& w, int64_t i) {
    if constexpr (kSignExtended<W, P>)
      bytes = w.q + i;
    else
      raw = *reinterpret_cast<const typename L::Words*>(word_address(w, i));
    if constexpr (std::is_same_v<P, Q8Rows>) {
      const float* s = w.scale + static_cast<uint64_t>(i) / kQ8Block;
      if constexpr (W == 16)
        scale = __builtin_shufflevector(typename L::Vec{} + s[0], typename L::Vec{} + s[1], 0, 1, 2, 3, 4, 5, 6, 7, 24,
                                        25, 26, 27, 28, 29, 30, 31);
      else
        scale = typename L::Vec{} + s[0];
    }
  }
  // part j of every word as float32 lanes: int8 numbers without their scale (integers), with it or
  // bf16 numbers (part)
  MF_ALWAYS_INLINE typename L::Vec integers(int j) const {
    if constexpr (kSignExtended<W, P>) return __builtin_convertvector(sign_extended(bytes + 8 * j), typename L::Vec);
    return __builtin_convertvector((raw << (24 - 8 * j)) >> 24, typename L::Vec);
  }
  MF_ALWAYS_INLINE typename L::Vec part(int j) const {
    if constexpr (std::is_same_v<P, Q8Rows>)
      return integers(j) * scale;
    else
      return (typename L::Vec)(j == 0 ? raw << 16 : raw & ~0xffff);  // bf16 bits at a float's top
  }
};

// x [M, K] (rows ldx apart) with every whole chunk of Q W numbers reordered to x[Q l + j] at j W + l
// (the rest as it is), into a buffer of this thread: [M, K]
template <int W, int Q>
MF_ALWAYS_INLINE const float* chunked_x(const float* x, int64_t ldx, int64_t M, int64_t K) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(M * K));
  constexpr int C = Q * W;
  for (int64_t m = 0; m < M; ++m) {
    const float* from = x + m * ldx;
    float* to = buf.data() + m * K;
    int64_t c = 0;
    for (; c + C <= K; c += C)
      for (int j = 0; j < Q; ++j)
        for (int l = 0; l < W; ++l) to[c + j * W + l] = from[c + Q * l + j];
    std::copy(from + c, from + K, to + c);
  }
  return buf.data();
}

// acc[m][n] += the whole chunks of x (chunked_x) times w's rows at + n ldw; returns where they end
template <int W, int RM, int RN, bool Ahead, class P>
MF_ALWAYS_INLINE int64_t chunks(typename Bf16Lanes<W>::Vec (&acc)[RM][RN], const float* x, int64_t ldx, int64_t K,
                                const P& w, int64_t at, int64_t ldw, int64_t next) {
  using Vec = typename Bf16Lanes<W>::Vec;
  constexpr int C = kParts<P> * W;
  int64_t k = 0;
  for (; k + C <= K; k += C) {
    if constexpr (Ahead)
      for (int n = 0; n < RN; ++n) __builtin_prefetch(word_address(w, at + next + n * ldw + k));
    Chunk<W, P> chunk[RN];
    for (int n = 0; n < RN; ++n) chunk[n].load(w, at + n * ldw + k);
    if constexpr (std::is_same_v<P, Q8Rows> && W < 16) {
      // int8 on AVX2 and baseline: each weight row's sum over the chunk, then times its scale (one
      // block of 32 numbers at W 8), not every weight times it. One thread from L2, GFLOP/s at 1 / 2 /
      // 8 / 64 x rows: AVX2 24 / 36 / 38 / 39 -> 30 / 46 / 39 / 42, baseline 13 / 18 / 17 / 18 -> 14 /
      // 20 / 19 / 20; AVX-512 43 / 67 / 113 / 123 -> 44 / 84 / 69 / 78: not there.
      for (int n = 0; n < RN; ++n) {
        Vec wn[4];
        for (int j = 0; j < 4; ++j) wn[j] = chunk[n].integers(j);
        for (int m = 0; m < RM; ++m) {
          const Vec* xm = reinterpret_cast<const Vec*>(x + m * ldx + k);
          Vec sum = xm[0] * wn[0];
          for (int j = 1; j < 4; ++j) sum += xm[j] * wn[j];
          acc[m][n] += sum * chunk[n].scale;
        }
      }
    } else {
      for (int j = 0; j < kParts<P>; ++j) {
        Vec wj[RN];
        for (int n = 0; n < RN; ++n) wj[n] = chunk[n].part(j);
        for (int m = 0; m < RM; ++m) {
          const Vec xk = *reinterpret_cast<const Vec*>(x + m * ldx + k + j * W);
          for (int n = 0; n < RN; ++n) acc[m][n] += xk * wj[n];
        }
      }
    }
  }
  return k;
}
MF_ALWAYS_INLINE void prefetch_weights(const float* w, int64_t i) { __builtin_prefetch(w + i); }
MF_ALWAYS_INLINE void prefetch_weights(const uint16_t* w, int64_t i) { __builtin_prefetch(w + i); }
MF_ALWAYS_INLINE void prefetch_weights(const Bf16Words& w, int64_t i) { __builtin_prefetch(w.p + i); }
MF_ALWAYS_INLINE void prefetch_weights(const Q8Rows& w, int64_t i) { __builtin_prefetch(w.q + i); }
MF_ALWAYS_INLINE float weight_value(const float* w, int64_t i) { return w[i]; }
MF_ALWAYS_INLINE float weight_value(const uint16_t* w, int64_t i) { return bf16_value(w[i]); }
MF_ALWAYS_INLINE float weight_value(const Bf16Words& w, int64_t i) { return bf16_value(w.p[i]); }
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
  if constexpr ((kParts<P>) > 1) k = chunks<W, RM, RN, Ahead>(acc, x, ldx, K, w, at, ldw, next);
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

// Tiles of rows n0 + t + j S (j < RN, S = (n1 - n0) / RN) are taken from kStridedNumbers weights
// on (512 KB of float32) for one or two x rows, where a tile of neighbouring rows would end each
// weight stream every RN rows: each stream runs on through consecutive rows. One-row products, 2
// threads, 460 MB of weights: rows of 288 numbers 38-45 -> 49-54 GB/s, of 1024 41-52 -> 49-55
// (docs/benchmarks.md); the 64-expert model's decode step (in-process rounds) float32 0.91-0.92x
// the time; the quickstart's, whose weights the cache holds, 1.01-1.10x, where strided tiles for
// every product took 1.07-1.18x; the AVX2 variant (MOEFORGE_SIMD=avx2) 0.84x, the quickstart 0.96x.
// Counted in numbers, not bytes: bf16 and int8 rows are shorter streams still, and the
// 64-expert model's experts (shares of 147 K numbers) took 0.94x (AVX2 0.86x) the step in bf16
// and 0.89-0.96x (AVX2 0.82-1.05x) in int8 against a 512 KB threshold. At 4 and 8 x rows (batch 4
// and 8): 1.00x and 0.96-0.98x, the quickstart's 1.035x: not taken there.
constexpr int64_t kStridedNumbers = int64_t{128} << 10;

// rows [n0, n1) of w against every row of x: tiles of RN weight rows, neighbouring or with `strided`
// (n1 - n0) / RN apart, RM x rows at a time; returns where the whole tiles end
template <int W, int RM, int RN, class P>
MF_ALWAYS_INLINE int64_t rows_tiles(const float* x, int64_t ldx, int64_t M, int64_t K, const P& w, int64_t ldw,
                                    int64_t n0, int64_t n1, float* y, int64_t ldy, bool strided = false) {
  const int64_t tiles = (n1 - n0) / RN, apart = strided ? tiles : 1;
  const int64_t row = apart * ldw, next = strided ? ldw : RN * ldw;  // a tile's rows apart; the next tile's first
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = n0 + (strided ? t : t * RN), at = n * ldw;
    // the first tile prefetches the next weight rows; one x row only against int8 or widened bf16
    // weights, whose arithmetic a byte leaves the loads time (the 64-expert model's decode step:
    // int8 0.78-0.89x the time, AVX2 and baseline 0.91-0.92x; bf16 on AVX-512 0.81-0.96x): float32's
    // waits on memory anyway (1.18x), bf16 words on AVX2 read 0.93-1.08x
    constexpr bool narrow = std::is_same_v<P, Q8Rows> || std::is_same_v<P, const uint16_t*>;
    const bool ahead = M > 1 || narrow;
    int64_t m = 0;
    if (M >= RM && (RM > 1 || ahead))
      rows_tile<W, RM, RN, true>(x, ldx, K, w, at, row, next, y + n, ldy, apart), m = RM;
    for (; m + RM <= M; m += RM)
      rows_tile<W, RM, RN, false>(x + m * ldx, ldx, K, w, at, row, next, y + m * ldy + n, ldy, apart);
    if (m == 0 && ahead) rows_tile<W, 1, RN, true>(x, ldx, K, w, at, row, next, y + n, ldy, apart), m = 1;
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
  // bf16 on AVX2 and baseline: in words. One thread from L2, GFLOP/s at 1 / 2 / 8 / 64 x rows: AVX2
  // 27 / 45 / 59 / 69 -> 57 / 84 / 86 / 86, baseline 13 / 19 / 20 / 21 -> 31 / 29 / 28 / 31;
  // AVX-512 45 / 64 / 93 / 102 -> 68 / 71 / 91 / 97, but from DRAM (2 threads, 460 MB) 0.93x the
  // rate at one row and 0.84x at 8, and its decode steps at batch 8 1.01-1.13x the time: not there.
  if constexpr (std::is_same_v<P, const uint16_t*> && W < 16)
    return rows_body<W, RM, RN>(x, ldx, M, K, Bf16Words{w}, ldw, n0, n1, y, ldy);
  if constexpr ((kParts<P>) > 1 && !kSignExtended<W, P>) x = chunked_x<W, kParts<P>>(x, ldx, M, K), ldx = K;
  int64_t n = n0;
  constexpr int few = W >= 16 ? 2 : 1;  // x rows a tile of 8 weight rows takes: 16 accumulators of 32 zmm, 8 of 16 ymm
  const bool large = (n1 - n0) * K >= kStridedNumbers;
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
template <class P>
__attribute__((target("avx2,fma"))) void rows_avx2 MF_ROWS_PARAMS {
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
