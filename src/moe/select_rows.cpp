#include "moe/select_rows.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "core/simd.h"

namespace mf {
namespace {

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

// One row. With K groups of 8 columns or more and no NaN, the K-th largest of the groups'
// maxima is a floor: K groups hold a score at least that large, so no score below it is among
// the K largest, and only the few at or above it are offered (in column order, so ties end as
// they would). Scratch: E / 8 + K numbers of T and K indices.
template <typename T>
void top_k_row(const T* s, int64_t E, int64_t K, int64_t* best, T* value, T* scratch, int64_t* ignored) {
  constexpr int64_t G = 8;
  const int64_t groups = E / G;
  int nan = 0;
  for (int64_t j = 0; j < E; ++j) nan |= s[j] != s[j];
  int64_t n = 0;
  if (nan || groups < K) {
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

template <typename T>
void top_k_cpu(const at::Tensor& s_TE, int64_t K, at::Tensor& index_TK) {
  const int64_t E = s_TE.size(1);
  const T* s = s_TE.data_ptr<T>();
  int64_t* out = index_TK.data_ptr<int64_t>();
  at::parallel_for(0, s_TE.size(0), 256, [&](int64_t t0, int64_t t1) {
    std::vector<T> value(K), scratch(E / 8 + K);
    std::vector<int64_t> ignored(K);
    for (int64_t t = t0; t < t1; ++t)
      top_k_row(s + t * E, E, K, out + t * K, value.data(), scratch.data(), ignored.data());
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
