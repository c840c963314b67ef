#include "model/rope_rows.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "core/simd.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where rows of D numbers lie: row (b, h, t) at b sb + h sh + t st
struct Rows {
  int64_t sb, sh, st;
  static Rows of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }
  int64_t at(int64_t b, int64_t h, int64_t t) const { return b * sb + h * sh + t * st; }
};

// pairs [p0, p1) of (b, h) = (p / H, p % H), every position t < T: out = the rotation of a, forward
// (Inverse false: the formulas of rope_rows.h's y) or its transpose (the backward's dx)
template <bool Inverse, typename T>
MF_ALWAYS_INLINE void rotate_rows(const T* a, Rows in, const T* c, const T* s, int64_t p0, int64_t p1, int64_t H,
                                  int64_t positions, int64_t D, T* out, Rows to) {
  const int64_t h = D / 2;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t t = 0; t < positions; ++t) {
      const T* ar = a + in.at(p / H, p % H, t);
      T* o = out + to.at(p / H, p % H, t);
      const T *cr = c + t * D, *sr = s + t * D;
      const T *s_lo = Inverse ? sr + h : sr, *s_hi = Inverse ? sr : sr + h;
      const T sign = Inverse ? T(-1) : T(1);
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) {
        const T lo = ar[i], hi = ar[i + h];
        o[i] = lo * cr[i] - sign * hi * s_lo[i];
        o[i + h] = hi * cr[i + h] + sign * lo * s_hi[i];
      }
    }
}
template <typename T>
MF_ALWAYS_INLINE void rotate_body(const T* a, Rows in, const T* c, const T* s, int64_t p0, int64_t p1, int64_t H,
                                  int64_t positions, int64_t D, T* out, Rows to, bool inverse) {
  if (inverse)
    rotate_rows<true>(a, in, c, s, p0, p1, H, positions, D, out, to);
  else
    rotate_rows<false>(a, in, c, s, p0, p1, H, positions, D, out, to);
}
MF_SIMD_FUNCTION(rotate_kernel, rotate_body,
                 (const float* a, Rows in, const float* c, const float* s, int64_t p0, int64_t p1, int64_t H,
                  int64_t positions, int64_t D, float* out, Rows to, bool inverse),
                 (a, in, c, s, p0, p1, H, positions, D, out, to, inverse))
MF_SIMD_FUNCTION(rotate_kernel, rotate_body,
                 (const double* a, Rows in, const double* c, const double* s, int64_t p0, int64_t p1, int64_t H,
                  int64_t positions, int64_t D, double* out, Rows to, bool inverse),
                 (a, in, c, s, p0, p1, H, positions, D, out, to, inverse))

// out = the rotation of a (both [B, H, T, D], the last dimension contiguous)
void rotate(const at::Tensor& a, const at::Tensor& c, const at::Tensor& s, at::Tensor& out, bool inverse) {
  const int64_t B = a.size(0), H = a.size(1), T = a.size(2), D = a.size(3);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, T * D));
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "rope_rows", [&] {
    const scalar_t *ad = a.data_ptr<scalar_t>(), *cd = c.data_ptr<scalar_t>(), *sd = s.data_ptr<scalar_t>();
    scalar_t* od = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, grain, [&](int64_t p0, int64_t p1) {
      rotate_kernel(ad, Rows::of(a), cd, sd, p0, p1, H, T, D, od, Rows::of(out), inverse);
    });
  });
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
    auto y = at::empty(x.sizes(), x.options());
    rotate(x, c, s, y, false);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, c, s});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &c = saved[1], &s = saved[2];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto g = grads[0].stride(3) == 1 ? grads[0] : grads[0].contiguous();
    auto dx = at::empty_like(x);  // x's layout: the transposes back to the projections stay views
    if (dx.stride(3) != 1) dx = at::empty(x.sizes(), x.options());
    rotate(g, c, s, dx, true);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool rope_rows_applies(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  return x.is_cpu() && x.dim() == 4 && x.size(3) % 2 == 0 && (dtype == at::kFloat || dtype == at::kDouble);
}

at::Tensor rope_composed(const at::Tensor& x, const at::Tensor& cos_TD, const at::Tensor& sin_TD) {
  const auto D = x.size(-1);
  auto x1 = x.narrow(-1, 0, D / 2), x2 = x.narrow(-1, D / 2, D / 2);
  auto rotated = at::cat({-x2, x1}, -1);
  return x * cos_TD + rotated * sin_TD;
}

at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos_TD, const at::Tensor& sin_TD) {
  if (!rope_rows_applies(x)) return rope_composed(x, cos_TD, sin_TD);
  TORCH_CHECK(cos_TD.sizes() == sin_TD.sizes() && cos_TD.dim() == 2 && cos_TD.size(0) == x.size(2) &&
                  cos_TD.size(1) == x.size(3),
              "rope_rows: tables ", cos_TD.sizes(), " and ", sin_TD.sizes(), " for x ", x.sizes());
  const auto c = cos_TD.to(x.scalar_type()).contiguous(), s = sin_TD.to(x.scalar_type()).contiguous();
  return RopeFn::apply(x.stride(3) == 1 ? x : x.contiguous(), c, s);
}

}  // namespace mf
