#include "moe/select_rows.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace mf {
namespace {

// a ranks above b: larger, or NaN over a number (at::topk's order)
template <typename T>
bool above(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

// One row: value/best hold the first K columns sorted (descending), then every later column that
// ranks above the K-th enters by insertion. Later columns enter only when strictly above, so
// equal scores stay in column order.
template <typename T>
void top_k_row(const T* s, int64_t E, int64_t K, int64_t* best, T* value) {
  int64_t n = 0;
  for (int64_t j = 0; j < E; ++j) {
    const T v = s[j];
    if (n == K && !above(v, value[K - 1])) continue;
    int64_t i = n < K ? n++ : K - 1;
    for (; i > 0 && above(v, value[i - 1]); --i) {
      best[i] = best[i - 1];
      value[i] = value[i - 1];
    }
    best[i] = j;
    value[i] = v;
  }
}

template <typename T>
void top_k_cpu(const at::Tensor& s_TE, int64_t K, at::Tensor& index_TK) {
  const int64_t E = s_TE.size(1);
  const T* s = s_TE.data_ptr<T>();
  int64_t* out = index_TK.data_ptr<int64_t>();
  at::parallel_for(0, s_TE.size(0), 256, [&](int64_t t0, int64_t t1) {
    std::vector<T> value(K);
    for (int64_t t = t0; t < t1; ++t) top_k_row(s + t * E, E, K, out + t * K, value.data());
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
