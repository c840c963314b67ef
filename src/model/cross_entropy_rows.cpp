#include "model/cross_entropy_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "core/exp_poly.h"
#include "core/simd.h"

namespace mf {
namespace {

// one row: the maximum m, e_v = exp(z_v - m) stored in z, lse = m + log sum e, then z *= scale / sum
template <typename T>
MF_ALWAYS_INLINE void ce_rows(T* z, const int64_t* target, T* loss, int64_t n, int64_t V, T scale) {
  for (int64_t r = 0; r < n; ++r) {
    T* zr = z + r * V;
    T top = zr[0];
#pragma omp simd reduction(max : top)
    for (int64_t v = 0; v < V; ++v) top = zr[v] > top ? zr[v] : top;
    const T picked = zr[target[r]];
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += zr[v] = exp_lanes(zr[v] - top);
    loss[r] = top + std::log(sum) - picked;
    const T k = scale / sum;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) zr[v] *= k;
    zr[target[r]] -= scale;
  }
}
MF_SIMD_FUNCTION(ce_rows_kernel, ce_rows,
                 (float* z, const int64_t* target, float* loss, int64_t n, int64_t V, float scale),
                 (z, target, loss, n, V, scale))
MF_SIMD_FUNCTION(ce_rows_kernel, ce_rows,
                 (double* z, const int64_t* target, double* loss, int64_t n, int64_t V, double scale),
                 (z, target, loss, n, V, scale))

}  // namespace

at::Tensor cross_entropy_rows_composed_(at::Tensor& z_nV, const at::Tensor& t_n, double scale) {
  const auto lse_n = z_nV.logsumexp(1, /*keepdim=*/true);
  const auto t = t_n.to(at::kLong).unsqueeze(1);
  auto loss = lse_n.squeeze(1) - z_nV.gather(1, t).squeeze(1);
  z_nV.sub_(lse_n).exp_().scatter_add_(1, t, at::full({z_nV.size(0), 1}, -1.0, z_nV.options())).mul_(scale);
  return loss;
}

at::Tensor cross_entropy_rows_(at::Tensor& z_nV, const at::Tensor& t_n, double scale) {
  TORCH_CHECK(z_nV.dim() == 2, "cross_entropy_rows_: logits [n, V] expected, got ", z_nV.sizes());
  if (!z_nV.is_cpu() || !z_nV.is_contiguous() ||
      (z_nV.scalar_type() != at::kFloat && z_nV.scalar_type() != at::kDouble))
    return cross_entropy_rows_composed_(z_nV, t_n, scale);
  const int64_t n = z_nV.size(0), V = z_nV.size(1);
  const auto t = t_n.to(at::kLong).contiguous();
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, "cross_entropy_rows_: targets ", t.sizes(), " for ", n, " rows");
  if (n == 0) return at::empty({0}, z_nV.options());
  const auto low = t.min().item<int64_t>(), high = t.max().item<int64_t>();
  TORCH_CHECK(low >= 0 && high < V, "cross_entropy_rows_: target ", low < 0 ? low : high,
              " is outside the vocabulary [0, ", V, ")");
  auto loss = at::empty({n}, z_nV.options());
  AT_DISPATCH_FLOATING_TYPES(z_nV.scalar_type(), "cross_entropy_rows_", [&] {
    scalar_t* z = z_nV.data_ptr<scalar_t>();
    scalar_t* out = loss.data_ptr<scalar_t>();
    const int64_t* target = t.data_ptr<int64_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 14) / V), [&](int64_t r0, int64_t r1) {
      ce_rows_kernel(z + r0 * V, target + r0, out + r0, r1 - r0, V, static_cast<scalar_t>(scale));
    });
  });
  return loss;
}

}  // namespace mf
