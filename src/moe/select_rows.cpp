#include "moe/select_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/simd.h"

namespace mf {
namespace {

// radix_row from K 16 on, and from E 32 on with AVX2 or AVX-512 (two threads, T 4096, k 8: E 128
// 0.79 -> 0.45 ms, E 64 0.75 -> 0.35; baseline's 4-lane counts lose below K 16: E 128 0.76 -> 1.01)
constexpr int64_t kRadixFromK = 16, kRadixFromE = 32;

// a ranks above b: larger, or NaN over a number (at::topk's order)
template <typename T>
bool above(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

// the column's score enters best/value (n of K filled, sorted descending) if it ranks above the
// K-th; later columns enter only when strictly above, so equal scores stay in column order
template <typename T, bool numbers = false>  // numbers: the row holds no NaN
MF_ALWAYS_INLINE void offer(T v, int64_t j, int64_t K, int64_t& n, int64_t* best, T* value) {
  const auto ranks = [](T a, T b) { return numbers ? a > b : above(a, b); };
  if (n == K && !ranks(v, value[K - 1])) return;
  int64_t i = n < K ? n++ : K - 1;
  for (; i > 0 && ranks(v, value[i - 1]); --i) {
    best[i] = best[i - 1];
    value[i] = value[i - 1];
  }
  best[i] = j;
  value[i] = v;
}

template <typename T>
bool has_nan(const T* s, int64_t E) {
  int nan = 0;
  for (int64_t j = 0; j < E; ++j) nan |= s[j] != s[j];
  return nan;
}

// One row. With K groups of 8 columns or more and no NaN, the K-th largest of the groups'
// maxima is a floor: K groups hold a score at least that large, so no score below it is among
// the K largest, and only the few at or above it are offered (in column order, so ties end as
// they would). Scratch: E / 8 + K numbers of T and K indices.
template <typename T>
void top_k_row(const T* s, int64_t E, int64_t K, int64_t* best, T* value, T* scratch, int64_t* ignored) {
  constexpr int64_t G = 8;
  const int64_t groups = E / G;
  int64_t n = 0;
  if (has_nan(s, E) || groups < K) {
    for (int64_t j = 0; j < E; ++j) offer(s[j], j, K, n, best, value);
    return;
  }
  T* most = scratch;
  for (int64_t g = 0; g < groups; ++g) {
    T m = s[g * G];
    for (int64_t i = 1; i < G; ++i) m = s[g * G + i] > m ? s[g * G + i] : m;
    most[g] = m;
  }
  T* kth = scratch + groups;
  int64_t held = 0;
  for (int64_t g = 0; g < groups; ++g) offer<T, true>(most[g], g, K, held, ignored, kth);
  const T floor = kth[K - 1];
  for (int64_t j = 0; j < E; ++j)
    if (s[j] >= floor) offer<T, true>(s[j], j, K, n, best, value);
}

// One row without NaN, E a multiple of kLanes and K <= kLanes: top_k_row's floor from the lanes'
// maxima (lane l: columns l, l + kLanes, ...) with the K-th largest found by counting, vectorised,
// and the columns at or above it listed without a branch before they are offered (the groups'
// offers and the scan's branch were most of the row: E 128, k 8, one thread 1.96 -> 1.6 ms).
// Scratch: E numbers and E indices.
constexpr int64_t kLanes = 16;
template <typename T>
MF_ALWAYS_INLINE void lanes_row(const T* s, int64_t E, int64_t K, int64_t* best, T* value, int64_t* column) {
  T most[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) most[l] = s[l];
  for (int64_t c = kLanes; c < E; c += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) most[l] = s[c + l] > most[l] ? s[c + l] : most[l];
  int32_t above[kLanes] = {};  // lane maxima larger than lane i's
  for (int64_t l = 0; l < kLanes; ++l)
    for (int64_t i = 0; i < kLanes; ++i) above[i] += most[l] > most[i];
  constexpr T inf = std::numeric_limits<T>::infinity();
  T floor = inf;  // the least of the K largest maxima
#pragma omp simd reduction(min : floor)
  for (int64_t i = 0; i < kLanes; ++i) floor = std::min(floor, above[i] < K ? most[i] : inf);
  int64_t n = 0;
  for (int64_t j = 0; j < E; ++j) {
    value[n] = s[j];
    column[n] = j;
    n += s[j] >= floor;
  }
  int64_t held = 0;
  T kept[kLanes];
  for (int64_t i = 0; i < n; ++i) offer<T, true>(value[i], column[i], K, held, best, kept);
}
MF_SIMD_FUNCTION(lanes_kernel, lanes_row,
                 (const float* s, int64_t E, int64_t K, int64_t* best, float* value, int64_t* column),
                 (s, E, K, best, value, column))
MF_SIMD_FUNCTION(lanes_kernel, lanes_row,
                 (const double* s, int64_t E, int64_t K, int64_t* best, double* value, int64_t* column),
                 (s, E, K, best, value, column))

// The key of a score: a signed integer ordered as the scores are (-0 taken as +0, as > takes it)
template <typename T>
using KeyOf = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
template <typename T>
MF_ALWAYS_INLINE KeyOf<T> ordered_key(T v) {
  using Key = KeyOf<T>;
  const T positive_zero = v + T(0);
  Key bits;
  std::memcpy(&bits, &positive_zero, sizeof bits);
  return bits ^ ((bits >> (8 * sizeof(Key) - 1)) & std::numeric_limits<Key>::max());
}

// One row without NaN and without a branch on the scores (kRadixFromK, kRadixFromE): the offers'
// branches mispredict (one thread, T 4096: E 256, K 32 12.1 -> 7.1 ms; E 128, K 16 5.0 ->
// 3.9; at K 8 the offers win, E 128 1.9 against 3.5 ms). The K-th largest key bit by bit from the top,
// count(key >= t) >= K deciding each bit, from the highest bit on which the keys differ, and
// ending where exactly K keys are at or above t (those are then the K largest): probabilities
// share their sign and top exponent bits, and the K-th and the next part a few bits further on.
// Then the columns above the floor and ties at it in column order, found through bit masks, and
// each chosen column's place among them counted (larger first, ties in column order). Two threads,
// T 4096, E 256, K 32: 4.6 -> 1.45 ms. Scratch: E keys, K + 1 keys and K + 1 indices.
template <typename T>
MF_ALWAYS_INLINE void radix_row(const T* s, int64_t E, int64_t K, int64_t* best, KeyOf<T>* key, KeyOf<T>* ck,
                                int64_t* chosen) {
  using Key = KeyOf<T>;
  using Bits = std::make_unsigned_t<Key>;
  constexpr int width = 8 * sizeof(Key);
  constexpr Bits sign = Bits{1} << (width - 1);
  Bits all = ~Bits{0}, any = 0;  // in the unsigned order: key ^ sign
  for (int64_t j = 0; j < E; ++j) {
    key[j] = ordered_key(s[j]);
    all &= static_cast<Bits>(key[j]) ^ sign;
    any |= static_cast<Bits>(key[j]) ^ sign;
  }
  const Bits differ = all ^ any;
  const int top = differ ? width - 1 - (sizeof(Key) == 4 ? __builtin_clz(differ) : __builtin_clzll(differ)) : -1;
  Bits kth = top < 0 ? all : all & ~((Bits{2} << top) - 1);  // the bits every key shares
  Key floor = static_cast<Key>(kth ^ sign);                  // keys above it chosen, then ties at it
  for (int bit = top; bit >= 0; --bit) {
    const Bits t = kth | Bits{1} << bit;
    const Key cut = static_cast<Key>(t ^ sign);
    Key count = 0;
    for (int64_t j = 0; j < E; ++j) count += key[j] >= cut;
    if (count < K) continue;
    kth = t;
    floor = count == K ? cut - 1 : cut;  // exactly K at or above the cut: those, and no ties
    if (count == K) break;
  }
  Key ties = K;
  for (int64_t j = 0; j < E; ++j) ties -= key[j] > floor;
  // the columns above the floor and the first `ties` at it, 64 at a time by a bit mask of the
  // candidates (a store per column and a step on n each was a chain through every column)
  for (int64_t j0 = 0, n = 0; j0 < E; j0 += 64) {
    const int64_t span = std::min<int64_t>(64, E - j0);
    uint64_t mask = 0;
    for (int64_t i = 0; i < span; ++i) mask |= static_cast<uint64_t>(key[j0 + i] >= floor) << i;
    for (; mask; mask &= mask - 1) {
      const int64_t j = j0 + __builtin_ctzll(mask);
      if (key[j] == floor && ties-- <= 0) continue;
      chosen[n] = j;
      ck[n++] = key[j];
    }
  }
  for (int64_t i = 0; i < K; ++i) {
    Key place = 0;
    for (int64_t m = 0; m < K; ++m) place += ck[m] > ck[i] || (ck[m] == ck[i] && m < i);
    best[place] = chosen[i];
  }
}
MF_SIMD_FUNCTION(radix_kernel, radix_row,
                 (const float* s, int64_t E, int64_t K, int64_t* best, int32_t* key, int32_t* ck, int64_t* chosen),
                 (s, E, K, best, key, ck, chosen))
MF_SIMD_FUNCTION(radix_kernel, radix_row,
                 (const double* s, int64_t E, int64_t K, int64_t* best, int64_t* key, int64_t* ck, int64_t* chosen),
                 (s, E, K, best, key, ck, chosen))

template <typename T>
void top_k_cpu(const at::Tensor& s_TE, int64_t K, at::Tensor& index_TK) {
  const int64_t E = s_TE.size(1);
  const T* s = s_TE.data_ptr<T>();
  int64_t* out = index_TK.data_ptr<int64_t>();
  const bool radix = K >= kRadixFromK || (E >= kRadixFromE && simd_level() != SimdLevel::Base);
  const bool lanes = !radix && E % kLanes == 0 && K <= kLanes;
  at::parallel_for(0, s_TE.size(0), 256, [&](int64_t t0, int64_t t1) {
    std::vector<T> value(lanes ? E : K), scratch(E / 8 + K);
    std::vector<int64_t> ignored(K), chosen(radix ? K + 1 : lanes ? E : 0);
    std::vector<KeyOf<T>> key(radix ? E : 0), ck(radix ? K + 1 : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const T* row = s + t * E;
      const bool numbers = (radix || lanes) && !has_nan(row, E);
      if (numbers && radix)
        radix_kernel(row, E, K, out + t * K, key.data(), ck.data(), chosen.data());
      else if (numbers)
        lanes_kernel(row, E, K, out + t * K, value.data(), chosen.data());
      else
        top_k_row(row, E, K, out + t * K, value.data(), scratch.data(), ignored.data());
    }
  });
}

}  // namespace

at::Tensor top_k_index(const at::Tensor& scores_TE, int64_t K) {
  TORCH_CHECK(scores_TE.dim() == 2 && K >= 1 && K <= scores_TE.size(1),
              "top_k_index: need scores [T, E] and 1 <= K <= E");
  const auto dtype = scores_TE.scalar_type();
  if (!scores_TE.is_cpu() || (dtype != at::kFloat && dtype != at::kDouble))
    return std::get<1>(scores_TE.topk(K, -1, /*largest=*/true, /*sorted=*/true));
  const auto s_TE = scores_TE.contiguous();
  auto index_TK = at::empty({s_TE.size(0), K}, s_TE.options().dtype(at::kLong));
  if (dtype == at::kFloat)
    top_k_cpu<float>(s_TE, K, index_TK);
  else
    top_k_cpu<double>(s_TE, K, index_TK);
  return index_TK;
}

at::Tensor unit_order(const at::Tensor& unit_P, int64_t U) {
  if (!unit_P.is_cpu() || unit_P.scalar_type() != at::kLong)
    return std::get<1>(unit_P.sort(/*stable=*/true, 0, /*descending=*/false));
  const auto units = unit_P.contiguous();
  const int64_t P = units.numel();
  const int64_t* unit = units.data_ptr<int64_t>();
  std::vector<int64_t> next(static_cast<size_t>(U) + 1, 0);  // after the scan: each unit's next slot
  for (int64_t p = 0; p < P; ++p) {
    TORCH_CHECK(unit[p] >= 0 && unit[p] < U, "unit_order: pair ", p, " names unit ", unit[p], " of ", U);
    ++next[unit[p] + 1];
  }
  for (int64_t u = 0; u < U; ++u) next[u + 1] += next[u];
  auto order_P = at::empty({P}, units.options());
  int64_t* order = order_P.data_ptr<int64_t>();
  for (int64_t p = 0; p < P; ++p) order[next[unit[p]]++] = p;
  return order_P;
}

}  // namespace mf
