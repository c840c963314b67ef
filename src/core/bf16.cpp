#include "core/bf16.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/simd.h"
#include "core/tiles_linear.h"

namespace mf {
namespace {

// The row kernel over GCC vectors of W floats: a tile of RM rows of x by RN rows of w keeps
// RM x RN accumulators (the dot products' partial sums, one lane per k mod W), RN widened weight
// vectors and one x vector in registers: 16 + 4 + 1 of AVX-512's 32 zmm (RM = 4), 8 + 4 + 1 of
// AVX2's or SSE's 16 (RM = 2); one x row (two on AVX-512) takes tiles of 8 weight rows (rows_body).
template <int W>
struct Bf16Lanes {
  typedef float Vec __attribute__((vector_size(W * sizeof(float)), aligned(4), may_alias));
  typedef uint16_t Half __attribute__((vector_size(W * sizeof(uint16_t)), aligned(2), may_alias));
  typedef uint32_t Bits __attribute__((vector_size(W * sizeof(uint32_t))));
  typedef int8_t Bytes __attribute__((vector_size(W), aligned(1), may_alias));
  typedef int32_t Ints __attribute__((vector_size(W * sizeof(int32_t))));
  typedef int16_t Shorts __attribute__((vector_size(W * sizeof(int16_t))));
  typedef int32_t Words __attribute__((vector_size(W * sizeof(int32_t)), aligned(1), may_alias));
};

MF_ALWAYS_INLINE float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// W bf16 numbers from p as float32: each one's bits moved to the top half of a 32-bit lane
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec widen_lanes(const uint16_t* p) {
  using L = Bf16Lanes<W>;
  const typename L::Bits bits = __builtin_convertvector(*reinterpret_cast<const typename L::Half*>(p), typename L::Bits)
                                << 16;
  return (typename L::Vec)bits;  // a cast between vectors of one size keeps the bits
}

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
                                   const Q8Rows& w, int64_t at, int64_t ldw) {
  using L = Bf16Lanes<W>;
  using Vec = typename L::Vec;
  constexpr int C = 4 * W;
  int64_t k = 0;
  for (; k + C <= K; k += C) {
    typename L::Words raw[RN];
    Vec scale[RN];
    for (int n = 0; n < RN; ++n) {
      if constexpr (Ahead) __builtin_prefetch(w.q + at + (RN + n) * ldw + k);
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

// y[m * ldy + n] = sum_k x[m * ldx + k] w(at + n * ldw + k) for m < RM, n < RN; Ahead: the next
// tile's weight rows prefetched along the way
template <int W, int RM, int RN, bool Ahead, class P>
MF_ALWAYS_INLINE void rows_tile(const float* x, int64_t ldx, int64_t K, const P& w, int64_t at, int64_t ldw, float* y,
                                int64_t ldy) {
  using Vec = typename Bf16Lanes<W>::Vec;
  Vec acc[RM][RN];
  for (int m = 0; m < RM; ++m)
    for (int n = 0; n < RN; ++n) acc[m][n] = Vec{};
  int64_t k = 0;
  if constexpr (std::is_same_v<P, Q8Rows>) k = q8_chunks<W, RM, RN, Ahead>(acc, x, ldx, K, w, at, ldw);
  for (; k + W <= K; k += W) {
    Vec wk[RN];
    if constexpr (Ahead)
      for (int n = 0; n < RN; ++n) prefetch_weights(w, at + (RN + n) * ldw + k);
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
      y[m * ldy + n] = s;
    }
  }
}

// rows [n0, n1) of w against every row of x: tiles of RN weight rows, RM x rows at a time; returns
// where the whole tiles end
template <int W, int RM, int RN, class P>
MF_ALWAYS_INLINE int64_t rows_tiles(const float* x, int64_t ldx, int64_t M, int64_t K, const P& w, int64_t ldw,
                                    int64_t n0, int64_t n1, float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + RN <= n1; n += RN) {
    int64_t m = 0;  // the first tile prefetches the next weight rows, unless x is one row (it waits on memory anyway)
    if constexpr (RM > 1)
      if (M >= RM) rows_tile<W, RM, RN, true>(x, ldx, K, w, n * ldw, ldw, y + n, ldy), m = RM;
    for (; m + RM <= M; m += RM)
      rows_tile<W, RM, RN, false>(x + m * ldx, ldx, K, w, n * ldw, ldw, y + m * ldy + n, ldy);
    if (m == 0 && M > 1) rows_tile<W, 1, RN, true>(x, ldx, K, w, n * ldw, ldw, y + n, ldy), m = 1;
    for (; m < M; ++m) rows_tile<W, 1, RN, false>(x + m * ldx, ldx, K, w, n * ldw, ldw, y + m * ldy + n, ldy);
  }
  return n;
}

// rows [n0, n1) of w against every row of x. One or two x rows (a decode step's products) wait on
// memory, not arithmetic: tiles of 8 weight rows keep 8 streams in flight (f32 64-expert model, batch 1,
// 2 threads: down products at K = 288 from 37 to 44 GB/s; bf16 and int8 gained more). Baseline x86
// (W = 4) keeps tiles of 4: lane_sums takes at most W vectors.
template <int W, int RM, class P>
MF_ALWAYS_INLINE void rows_body(const float* x, int64_t ldx, int64_t M, int64_t K, const P& w, int64_t ldw, int64_t n0,
                                int64_t n1, float* y, int64_t ldy) {
  if constexpr (std::is_same_v<P, Q8Rows>) x = chunked_x<W>(x, ldx, M, K), ldx = K;
  int64_t n = n0;
  constexpr int few = W >= 16 ? 2 : 1;  // x rows a tile of 8 weight rows takes: 16 accumulators of 32 zmm, 8 of 16 ymm
  if constexpr (W >= 8)
    if (M <= few) n = rows_tiles<W, few, 8>(x, ldx, M, K, w, ldw, n, n1, y, ldy);
  n = rows_tiles<W, RM, 4>(x, ldx, M, K, w, ldw, n, n1, y, ldy);
  rows_tiles<W, 1, 1>(x, ldx, M, K, w, ldw, n, n1, y, ldy);
}

// rows [r0, r1) of w [.., K] (row stride ldw) widened into dst [.., K] (contiguous)
template <int W>
MF_ALWAYS_INLINE void bf16_widen_body(const uint16_t* w, int64_t ldw, int64_t K, int64_t r0, int64_t r1, float* dst) {
  using Vec = typename Bf16Lanes<W>::Vec;
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* src = w + r * ldw;
    float* out = dst + r * K;
    int64_t k = 0;
    for (; k + W <= K; k += W) *reinterpret_cast<Vec*>(out + k) = widen_lanes<W>(src + k);
    for (; k < K; ++k) out[k] = bf16_value(src[k]);
  }
}

// n float32 numbers rounded to bf16, to nearest, ties to even (as c10::BFloat16 rounds); NaN
// stays a quiet NaN
template <int W>
MF_ALWAYS_INLINE void bf16_round_body(const float* src, int64_t n0, int64_t n1, uint16_t* dst) {
  using L = Bf16Lanes<W>;
  typedef uint16_t Out __attribute__((vector_size(W * sizeof(uint16_t)), aligned(2), may_alias));
  typedef uint32_t In __attribute__((vector_size(W * sizeof(uint32_t)), aligned(4), may_alias));
  int64_t i = n0;
  for (; i + W <= n1; i += W) {
    const In bits = *reinterpret_cast<const In*>(src + i);
    const typename L::Bits rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const auto nan_lanes = reinterpret_cast<const typename L::Bits&>(bits) & 0x7FFFFFFFu;
    const typename L::Bits is_nan = (typename L::Bits)(nan_lanes > 0x7F800000u);  // all ones where NaN
    *reinterpret_cast<Out*>(dst + i) = __builtin_convertvector((rounded & ~is_nan) | (is_nan & 0x7FC0u), Out);
  }
  for (; i < n1; ++i) dst[i] = c10::BFloat16(src[i]).x;
}

#define MF_BF16_ROUND_PARAMS (const float* src, int64_t n0, int64_t n1, uint16_t* dst)
#define MF_BF16_ROUND_ARGS (src, n0, n1, dst)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void bf16_round_avx512 MF_BF16_ROUND_PARAMS {
  bf16_round_body<16> MF_BF16_ROUND_ARGS;
}
__attribute__((target("avx2,fma"))) void bf16_round_avx2 MF_BF16_ROUND_PARAMS { bf16_round_body<8> MF_BF16_ROUND_ARGS; }
#endif
void bf16_round_base MF_BF16_ROUND_PARAMS { bf16_round_body<4> MF_BF16_ROUND_ARGS; }

void bf16_round_range MF_BF16_ROUND_PARAMS {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return bf16_round_avx512 MF_BF16_ROUND_ARGS;
    case SimdLevel::Avx2: return bf16_round_avx2 MF_BF16_ROUND_ARGS;
    default: break;
  }
#endif
  bf16_round_base MF_BF16_ROUND_ARGS;
}
#undef MF_BF16_ROUND_ARGS
#undef MF_BF16_ROUND_PARAMS

#define MF_BF16_WIDEN_PARAMS (const uint16_t* w, int64_t ldw, int64_t K, int64_t r0, int64_t r1, float* dst)
#define MF_BF16_WIDEN_ARGS (w, ldw, K, r0, r1, dst)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void bf16_widen_avx512 MF_BF16_WIDEN_PARAMS {
  bf16_widen_body<16> MF_BF16_WIDEN_ARGS;
}
__attribute__((target("avx2,fma"))) void bf16_widen_avx2 MF_BF16_WIDEN_PARAMS { bf16_widen_body<8> MF_BF16_WIDEN_ARGS; }
#endif
void bf16_widen_base MF_BF16_WIDEN_PARAMS { bf16_widen_body<4> MF_BF16_WIDEN_ARGS; }

void bf16_widen_range MF_BF16_WIDEN_PARAMS {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return bf16_widen_avx512 MF_BF16_WIDEN_ARGS;
    case SimdLevel::Avx2: return bf16_widen_avx2 MF_BF16_WIDEN_ARGS;
    default: break;
  }
#endif
  bf16_widen_base MF_BF16_WIDEN_ARGS;
}
#undef MF_BF16_WIDEN_ARGS
#undef MF_BF16_WIDEN_PARAMS

#define MF_ROWS_PARAMS \
  (const float* x, int64_t ldx, int64_t M, int64_t K, P w, int64_t ldw, int64_t n0, int64_t n1, float* y, int64_t ldy)
#define MF_ROWS_ARGS (x, ldx, M, K, w, ldw, n0, n1, y, ldy)
#if defined(__x86_64__) && defined(__GNUC__)
template <class P>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void rows_avx512 MF_ROWS_PARAMS {
  rows_body<16, 4> MF_ROWS_ARGS;
}
template <class P>
__attribute__((target("avx2,fma"))) void rows_avx2 MF_ROWS_PARAMS {
  rows_body<8, 2> MF_ROWS_ARGS;
}
#endif
template <class P>
void rows_base MF_ROWS_PARAMS {
  rows_body<4, 2> MF_ROWS_ARGS;
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

// our kernel can take it: float32 x and a bf16 or int8 w with contiguous rows, on the CPU, no autograd
bool row_kernel_applies(const at::Tensor& x, const at::Tensor& w) {
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad());
  return held_narrow(w.scalar_type()) && x.scalar_type() == at::kFloat && x.is_cpu() && w.is_cpu() && w.dim() == 2 &&
         w.stride(1) == 1 && !grad;
}

// rows [r0, r1) of a bf16 or int8 w [.., K] as float32 rows into dst [.., K]
void widen_rows(const at::Tensor& w, int64_t r0, int64_t r1, float* dst) {
  const int64_t ld = w.stride(0), K = w.size(1);
  if (w.scalar_type() == at::kChar) return q8_widen_range(q8_of(w), ld, K, r0, r1, dst);
  bf16_widen_range(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), ld, K, r0, r1, dst);
}

// out = x w^T with w widened to float32 in panels of 4 MB (LibTorch's bf16 -> float copy ran at
// 1.2 GB/s, slower than the GEMM it feeds): the GEMM does the work
void widened_panels(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t rows = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(K, 1) / 2 * 2);
  auto panel = at::empty({std::min(rows, N), K}, x.options());
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n = std::min(rows, N - n0);
    const auto part = w.narrow(0, n0, n);
    at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) { widen_rows(part, r0, r1, panel.data_ptr<float>()); });
    auto dst = out.narrow(1, n0, n);
    at::mm_out(dst, x, panel.narrow(0, 0, n).t());
  }
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

void project_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  if (!row_kernel_applies(x, w)) {
    at::mm_out(out, x, widened(w, x.scalar_type()).t());
    return;
  }
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == w.size(0) &&
                  x.size(1) == w.size(1) && out.stride(1) == 1 && out.scalar_type() == at::kFloat,
              "project_into: x ", x.sizes(), ", w ", w.sizes(), " and out ", out.sizes(), " do not fit");
  if (x.size(0) > kBf16KernelRows) return widened_panels(out, x, w);
  const auto xr = x.stride(1) == 1 ? x : x.contiguous();
  if (w.scalar_type() == at::kChar)
    return q8_rows(xr.data_ptr<float>(), xr.stride(0), xr.size(0), xr.size(1), q8_of(w), w.stride(0), w.size(0),
                   out.data_ptr<float>(), out.stride(0));
  bf16_rows(xr.data_ptr<float>(), xr.stride(0), xr.size(0), xr.size(1),
            reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), w.stride(0), w.size(0),
            out.data_ptr<float>(), out.stride(0));
}

bool held_narrow(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kChar; }

at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!row_kernel_applies(x, w)) return tiles_linear(x, widened(w, x.scalar_type()), b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  const auto x_MK = x.reshape({-1, x.size(-1)});
  auto y_MN = at::empty({x_MK.size(0), w.size(0)}, x.options());
  project_into(y_MN, x_MK, w);
  if (b.defined()) y_MN.add_(b);
  return y_MN.view(sizes);
}

at::Tensor embed_rows(const at::Tensor& ids, const at::Tensor& table) {
  if (table.scalar_type() != at::kChar) {
    auto rows = at::embedding(table, ids);
    return table.scalar_type() == at::kBFloat16 ? rows.to(at::kFloat) : rows;
  }
  const auto id = ids.to(at::kLong).contiguous();
  auto sizes = ids.sizes().vec();
  sizes.push_back(table.size(1));
  auto out = at::empty(sizes, table.options().dtype(at::kFloat));
  for (int64_t i = 0; i < id.numel(); ++i)
    weight_row(table, id.data_ptr<int64_t>()[i], out.data_ptr<float>() + i * table.size(1));
  return out;
}

void weight_row(const at::Tensor& w, int64_t r, float* out) {
  TORCH_CHECK(w.dim() == 2 && r >= 0 && r < w.size(0), "row ", r, " of a weight ", w.sizes());
  TORCH_CHECK((w.scalar_type() == at::kFloat || held_narrow(w.scalar_type())) && w.stride(1) == 1, "row ", r, " of a ",
              w.scalar_type(), " weight ", w.sizes(), " with strides ", w.strides());
  if (w.scalar_type() == at::kFloat) {
    std::copy_n(w.data_ptr<float>() + r * w.stride(0), w.size(1), out);
    return;
  }
  const int64_t ld = w.stride(0), K = w.size(1);  // no narrow(): a LibTorch call per decoded row
  if (w.scalar_type() == at::kChar) return q8_widen_range(q8_of(w).from(r * ld), ld, K, 0, 1, out);
  bf16_widen_range(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()) + r * ld, ld, K, 0, 1, out);
}

void copy_weights(at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.sizes() == src.sizes(), "copy_weights: ", src.sizes(), " into ", dst.sizes());
  if (dst.scalar_type() == at::kChar) return q8_quantize(dst, src);
  const bool fast = dst.scalar_type() == at::kBFloat16 && src.scalar_type() == at::kFloat && dst.is_cpu() &&
                    src.is_cpu() && dst.is_contiguous() && src.is_contiguous();
  if (!fast) {
    dst.copy_(src);
    return;
  }
  const auto* from = src.data_ptr<float>();
  auto* to = reinterpret_cast<uint16_t*>(dst.data_ptr<at::BFloat16>());
  at::parallel_for(0, src.numel(), int64_t{1} << 16,
                   [&](int64_t n0, int64_t n1) { bf16_round_range(from, n0, n1, to); });
  dst.unsafeGetTensorImpl()->bump_version();
}

at::Tensor widened(const at::Tensor& w, at::ScalarType dtype) {
  if (w.scalar_type() == at::kChar && dtype != at::kChar) {
    auto out = at::empty(w.sizes(), w.options().dtype(at::kFloat));
    const int64_t K = w.dim() > 0 ? w.size(-1) : 1, rows = K > 0 ? w.numel() / K : 0;
    const auto w_NK = w.reshape({rows, K});  // every leading dimension as rows
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) { widen_rows(w_NK, r0, r1, out.data_ptr<float>()); });
    return out.to(dtype);
  }
  if (w.scalar_type() == dtype || w.scalar_type() != at::kBFloat16) return w;
  if (dtype != at::kFloat || !w.is_cpu() || !w.is_contiguous() || w.requires_grad()) return w.to(dtype);
  auto out = at::empty(w.sizes(), w.options().dtype(at::kFloat));  // LibTorch's own copy: 0.3 GB/s
  const int64_t K = w.dim() > 0 ? w.size(-1) : 1, rows = K > 0 ? w.numel() / K : 0;
  const auto* bits = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(K, 1)),
                   [&](int64_t r0, int64_t r1) { bf16_widen_range(bits, K, K, r0, r1, out.data_ptr<float>()); });
  return out;
}

}  // namespace mf
