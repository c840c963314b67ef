#include "moe/fused_units.h"

#include <algorithm>
#include <type_traits>

#include "core/exp_poly.h"
#include "core/simd.h"
#include "core/tiles.h"
#include "core/unit_gemm.h"

namespace mf {
namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// the identity of a tensor's contents as far as we can see it
void push_key(std::vector<int64_t>& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(reinterpret_cast<int64_t>(t.unsafeGetTensorImpl()));
  key.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
  key.push_back(static_cast<int64_t>(t._version()));
  for (auto s : t.sizes()) key.push_back(s);
}

std::shared_ptr<PackedUnits> pack(const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1,
                                  const at::Tensor& b2, int64_t blocks, bool swiglu) {
  auto p = std::make_shared<PackedUnits>();
  const int64_t E = down.size(0), D = down.size(1), F = down.size(2), M = F / blocks, U = E * blocks;
  p->blocks = blocks;
  p->D = D;
  p->M = M;
  p->Mp = round_up(M, kPad);
  p->n1 = swiglu ? 2 * p->Mp : p->Mp;
  p->Dp = round_up(D, kPad);
  p->swiglu = swiglu;
  const auto f32 = down.options().dtype(at::kFloat);
  p->w1_UDN = at::zeros({U, D, p->n1}, f32);
  p->b1_UN = at::zeros({U, p->n1}, f32);
  // the gate (or GELU) rows at column 0, SwiGLU's up rows at column Mp
  for (int64_t part = 0; part < (swiglu ? 2 : 1); ++part) {
    auto w = gate_up.narrow(1, part * F, F).reshape({U, M, D}).transpose(1, 2);  // [U, D, M]
    p->w1_UDN.narrow(2, part * p->Mp, M).copy_(w);
    if (b1.defined()) p->b1_UN.narrow(1, part * p->Mp, M).copy_(b1.narrow(1, part * F, F).reshape({U, M}));
  }
  p->w2_UMD = at::zeros({U, M, p->Dp}, f32);
  p->w2_UMD.narrow(2, 0, D).copy_(down.reshape({E, D, blocks, M}).permute({0, 2, 3, 1}).reshape({U, M, D}));
  if (b2.defined() && blocks == 1) {
    p->b2_ED = at::zeros({E, p->Dp}, f32);
    p->b2_ED.narrow(1, 0, D).copy_(b2);
  }
  return p;
}

}  // namespace

std::shared_ptr<const PackedUnits> UnitPack::get(const at::Tensor& gate_up, const at::Tensor& down,
                                                 const at::Tensor& gate_up_bias, const at::Tensor& down_bias,
                                                 int64_t blocks, bool swiglu) {
  std::vector<int64_t> key = {blocks, swiglu};
  for (const auto* t : {&gate_up, &down, &gate_up_bias, &down_bias}) push_key(key, *t);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!packed_ || key != key_) {
    at::NoGradGuard no_grad;
    packed_ = pack(gate_up, down, gate_up_bias, down_bias, blocks, swiglu);
    key_ = std::move(key);
  }
  return packed_;
}

// The kernel is written once over core/tiles.h's register tiles (W floats a vector, R rows x up to
// P vectors) and compiled for AVX-512, AVX2 + FMA and baseline x86-64 below.
namespace {

using tiles::Lanes;

// fn(NV, col) over the columns [0, n) (n: whole vectors) in panels of P (2 or 3) vectors, the
// rest in one panel of 1 or 2: a narrow unit (M = 24 in the ViT's blocks) computes no padding beyond a vector
template <int W, int P, typename Fn>
MF_ALWAYS_INLINE void each_panel(int64_t n, Fn&& fn) {
  int64_t col = 0;
  for (; col + P * W <= n; col += P * W) fn(std::integral_constant<int, P>(), col);
  if constexpr (P > 2)
    if (n - col == 2 * W) fn(std::integral_constant<int, 2>(), col);
  if (n - col == W) fn(std::integral_constant<int, 1>(), col);
}

// rows r0 .. r0 + R of `count` (the last one repeated past the end)
template <int R, typename RowFn>
MF_ALWAYS_INLINE void tile_rows(const float* (&a)[R], int64_t r0, int64_t count, RowFn&& row) {
  for (int r = 0; r < R; ++r) a[r] = row(std::min<int64_t>(r0 + r, count - 1));
}

// e^x: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by core/exp_poly.h, 2^n put into the exponent bits
template <int W>
MF_ALWAYS_INLINE typename Lanes<W>::Vec exp_vec(typename Lanes<W>::Vec x) {
  using Vec = typename Lanes<W>::Vec;
  using IVec = typename Lanes<W>::IVec;
  x = x < tiles::splat<W>(88.3762626647949f) ? x : tiles::splat<W>(88.3762626647949f);
  x = x > tiles::splat<W>(-87.3365447505531f) ? x : tiles::splat<W>(-87.3365447505531f);
  Vec n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504088896341f + 0.5f, IVec), Vec);
  n += __builtin_convertvector(n > x * 1.44269504088896341f + 0.5f, Vec);  // trunc -> floor (the mask is -1)
  const Vec r = x - n * kLn2Hi - n * kLn2Lo;
  return exp_reduced(r) * (Vec)((__builtin_convertvector(n, IVec) + 127) << 23);
}

// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), the formula LibTorch's
// vectorised GELU uses
template <int W>
MF_ALWAYS_INLINE typename Lanes<W>::Vec erf_vec(typename Lanes<W>::Vec x) {
  using Vec = typename Lanes<W>::Vec;
  const Vec a = x < 0.0f ? -x : x;
  const Vec t = 1.0f / (a * 0.3275911f + 1.0f);
  Vec poly = tiles::splat<W>(1.061405429f);
  for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f}) poly = poly * t + c;
  const Vec e = 1.0f - poly * t * exp_vec<W>(-(x * x));
  return x < 0.0f ? -e : e;
}

// A = act(H) on a chunk's rows, in place in H's first Mp columns (the padding stays 0)
template <int W>
MF_ALWAYS_INLINE void activate(const PackedUnits& p, float* h, int64_t rows) {
  using Vec = typename Lanes<W>::Vec;
  for (int64_t r = 0; r < rows; ++r) {
    float* g = h + r * p.n1;
    for (int64_t c = 0; c < p.Mp; c += W) {
      const Vec v = tiles::load<W>(g + c);
      Vec a;
      if (p.swiglu)
        a = v / (1.0f + exp_vec<W>(-v)) * tiles::load<W>(g + p.Mp + c);  // silu(gate) * up
      else
        a = v * 0.5f * (1.0f + erf_vec<W>(v * 0.70710678118654752f));  // x Phi(x)
      tiles::store<W>(g + c, a);
    }
  }
}

template <int W, int R, int P>
MF_ALWAYS_INLINE void fused_unit_body(const PackedUnits& p, int64_t u, const float* x, const int64_t* token,
                                      const float* weight, int64_t n, float* y, float* h) {
  using Vec = typename Lanes<W>::Vec;
  const int64_t D = p.D, e = u / p.blocks;
  const float* w1 = p.w1_UDN.data_ptr<float>() + u * D * p.n1;
  const float* b1 = p.b1_UN.data_ptr<float>() + u * p.n1;
  const float* w2 = p.w2_UMD.data_ptr<float>() + u * p.M * p.Dp;
  const float* b2 = p.b2_ED.defined() ? p.b2_ED.data_ptr<float>() + e * p.Dp : nullptr;
  for (int64_t c0 = 0; c0 < n; c0 += kFusedChunk) {
    const int64_t cn = std::min(kFusedChunk, n - c0);
    // H = X W1^T + b1   [cn, n1]
    each_panel<W, P>(p.n1, [&](auto nv, int64_t col) {
      constexpr int NV = decltype(nv)::value;
      for (int64_t r0 = 0; r0 < cn; r0 += R) {
        const float* a[R];
        tile_rows<R>(a, r0, cn, [&](int64_t r) { return x + token[c0 + r] * D; });
        Vec acc[R][NV];
        tiles::tile<W, R, NV>(a, D, w1 + col, p.n1, acc);
        for (int r = 0; r < R && r0 + r < cn; ++r)
          for (int v = 0; v < NV; ++v)
            tiles::store<W>(h + (r0 + r) * p.n1 + col + v * W, acc[r][v] + tiles::load<W>(b1 + col + v * W));
      }
    });
    activate<W>(p, h, cn);
    // y[token] += weight (A W2^T + b2)
    each_panel<W, P>(p.Dp, [&](auto nv, int64_t col) {
      constexpr int NV = decltype(nv)::value;
      for (int64_t r0 = 0; r0 < cn; r0 += R) {
        const float* a[R];
        tile_rows<R>(a, r0, cn, [&](int64_t r) { return h + r * p.n1; });
        Vec acc[R][NV];
        tiles::tile<W, R, NV>(a, p.M, w2 + col, p.Dp, acc);
        for (int r = 0; r < R && r0 + r < cn; ++r) {
          float* yr = y + token[c0 + r0 + r] * D;
          const float s = weight[c0 + r0 + r];
          for (int v = 0; v < NV; ++v) {
            const int64_t c = col + v * W;
            const Vec out = s * (b2 ? acc[r][v] + tiles::load<W>(b2 + c) : acc[r][v]);
            if (c + W <= D) {
              tiles::store<W>(yr + c, tiles::load<W>(yr + c) + out);
            } else {
              for (int64_t i = 0; c + i < D; ++i) yr[c + i] += out[i];
            }
          }
        }
      }
    });
  }
}

#define MF_FUSED_UNIT_ARGS (p, u, x, token, weight, n, y, h)
#define MF_FUSED_UNIT_PARAMS                                                                                        \
  (const PackedUnits& p, int64_t u, const float* x, const int64_t* token, const float* weight, int64_t n, float* y, \
   float* h)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void fused_unit_avx512 MF_FUSED_UNIT_PARAMS {
  fused_unit_body<16, 8, 3> MF_FUSED_UNIT_ARGS;
}
__attribute__((target("avx2,fma"))) void fused_unit_avx2 MF_FUSED_UNIT_PARAMS {
  fused_unit_body<8, 6, 2> MF_FUSED_UNIT_ARGS;
}
#endif
void fused_unit_base MF_FUSED_UNIT_PARAMS { fused_unit_body<4, 6, 2> MF_FUSED_UNIT_ARGS; }

}  // namespace

bool fused_units_available(const at::Tensor& x_TD) { return x_TD.is_cpu() && x_TD.scalar_type() == at::kFloat; }

bool fused_units_preferred(const at::Tensor& x_TD, int64_t pairs, int64_t units) {
  if (!fused_units_available(x_TD) || simd_level() == SimdLevel::Base) return false;
  return !unit_gemm_preferred(x_TD) || pairs < kFusedRowsMax * std::max<int64_t>(units, 1);
}

void fused_unit MF_FUSED_UNIT_PARAMS {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (simd_level()) {
    case SimdLevel::Avx512: return fused_unit_avx512 MF_FUSED_UNIT_ARGS;
    case SimdLevel::Avx2: return fused_unit_avx2 MF_FUSED_UNIT_ARGS;
    default: break;
  }
#endif
  fused_unit_base MF_FUSED_UNIT_ARGS;
}
#undef MF_FUSED_UNIT_ARGS
#undef MF_FUSED_UNIT_PARAMS

}  // namespace mf
