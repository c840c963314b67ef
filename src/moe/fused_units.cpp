#include "moe/fused_units.h"

#include <algorithm>
#include <type_traits>

#include "core/simd.h"

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

#if defined(__x86_64__) && defined(__GNUC__)
// everything up to fused_units_available runs on AVX-512 CPUs only (fused_units_available says so)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
namespace {

constexpr int kRows = 8, kWidth = 16;  // tiles of 8 rows x up to 3 vectors: 24 accumulators
static_assert(kWidth == kPad, "widths are padded to whole vectors");
typedef float Vec __attribute__((vector_size(kWidth * sizeof(float)), aligned(4), may_alias));

MF_ALWAYS_INLINE Vec load(const float* p) { return *reinterpret_cast<const Vec*>(p); }

// acc[r][v] = sum_k a[r][k] w[k ldw + v kWidth .. + kWidth)   (a[r]: row r, read through its pointer)
template <int NV>
MF_ALWAYS_INLINE void tile(const float* const (&a)[kRows], int64_t K, const float* w, int64_t ldw,
                           Vec (&acc)[kRows][NV]) {
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec{};
  for (int64_t k = 0; k < K; ++k) {
    Vec wk[NV];
    for (int v = 0; v < NV; ++v) wk[v] = load(w + k * ldw + v * kWidth);
    for (int r = 0; r < kRows; ++r) {
      const float s = a[r][k];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * wk[v];
    }
  }
}

// fn(NV, col) over the columns [0, n) (n: whole vectors) in panels of 3 vectors, the rest in one
// panel of 1 or 2: a narrow unit (M = 24 in the ViT's blocks) computes no padding beyond a vector
template <typename Fn>
MF_ALWAYS_INLINE void each_panel(int64_t n, Fn&& fn) {
  int64_t col = 0;
  for (; col + 3 * kWidth <= n; col += 3 * kWidth) fn(std::integral_constant<int, 3>(), col);
  if (n - col == 2 * kWidth) fn(std::integral_constant<int, 2>(), col);
  if (n - col == kWidth) fn(std::integral_constant<int, 1>(), col);
}

// rows r0 .. r0 + kRows of `count` (the last one repeated past the end)
template <typename RowFn>
MF_ALWAYS_INLINE void tile_rows(const float* (&a)[kRows], int64_t r0, int64_t count, RowFn&& row) {
  for (int r = 0; r < kRows; ++r) a[r] = row(std::min<int64_t>(r0 + r, count - 1));
}

typedef int32_t IVec __attribute__((vector_size(kWidth * sizeof(int32_t))));

MF_ALWAYS_INLINE Vec splat(float s) { return Vec{} + s; }

// e^x: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-5 polynomial (about 1 ulp),
// 2^n put into the exponent bits
MF_ALWAYS_INLINE Vec exp_vec(Vec x) {
  x = x < splat(88.3762626647949f) ? x : splat(88.3762626647949f);
  x = x > splat(-87.3365447505531f) ? x : splat(-87.3365447505531f);
  Vec n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504088896341f + 0.5f, IVec), Vec);
  n += __builtin_convertvector(n > x * 1.44269504088896341f + 0.5f, Vec);  // trunc -> floor (the mask is -1)
  const Vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec y = splat(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = y * r + c;
  y = y * r * r + r + 1.0f;
  return y * (Vec)((__builtin_convertvector(n, IVec) + 127) << 23);
}

// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), the formula LibTorch's
// vectorised GELU uses
MF_ALWAYS_INLINE Vec erf_vec(Vec x) {
  const Vec a = x < 0.0f ? -x : x;
  const Vec t = 1.0f / (a * 0.3275911f + 1.0f);
  Vec poly = splat(1.061405429f);
  for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f}) poly = poly * t + c;
  const Vec e = 1.0f - poly * t * exp_vec(-(x * x));
  return x < 0.0f ? -e : e;
}

// A = act(H) on a chunk's rows, in place in H's first Mp columns (the padding stays 0)
MF_ALWAYS_INLINE void activate(const PackedUnits& p, float* h, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* g = h + r * p.n1;
    for (int64_t c = 0; c < p.Mp; c += kWidth) {
      const Vec v = load(g + c);
      Vec a;
      if (p.swiglu)
        a = v / (1.0f + exp_vec(-v)) * load(g + p.Mp + c);  // silu(gate) * up
      else
        a = v * 0.5f * (1.0f + erf_vec(v * 0.70710678118654752f));  // x Phi(x)
      *reinterpret_cast<Vec*>(g + c) = a;
    }
  }
}

void fused_unit_avx512(const PackedUnits& p, int64_t u, const float* x, const int64_t* token, const float* weight,
                       int64_t n, float* y, float* h) {
  const int64_t D = p.D, e = u / p.blocks;
  const float* w1 = p.w1_UDN.data_ptr<float>() + u * D * p.n1;
  const float* b1 = p.b1_UN.data_ptr<float>() + u * p.n1;
  const float* w2 = p.w2_UMD.data_ptr<float>() + u * p.M * p.Dp;
  const float* b2 = p.b2_ED.defined() ? p.b2_ED.data_ptr<float>() + e * p.Dp : nullptr;
  for (int64_t c0 = 0; c0 < n; c0 += kFusedChunk) {
    const int64_t cn = std::min(kFusedChunk, n - c0);
    // H = X W1^T + b1   [cn, n1]
    each_panel(p.n1, [&](auto nv, int64_t col) {
      constexpr int NV = decltype(nv)::value;
      for (int64_t r0 = 0; r0 < cn; r0 += kRows) {
        const float* a[kRows];
        tile_rows(a, r0, cn, [&](int64_t r) { return x + token[c0 + r] * D; });
        Vec acc[kRows][NV];
        tile<NV>(a, D, w1 + col, p.n1, acc);
        for (int r = 0; r < kRows && r0 + r < cn; ++r)
          for (int v = 0; v < NV; ++v)
            *reinterpret_cast<Vec*>(h + (r0 + r) * p.n1 + col + v * kWidth) = acc[r][v] + load(b1 + col + v * kWidth);
      }
    });
    activate(p, h, cn);
    // y[token] += weight (A W2^T + b2)
    each_panel(p.Dp, [&](auto nv, int64_t col) {
      constexpr int NV = decltype(nv)::value;
      for (int64_t r0 = 0; r0 < cn; r0 += kRows) {
        const float* a[kRows];
        tile_rows(a, r0, cn, [&](int64_t r) { return h + r * p.n1; });
        Vec acc[kRows][NV];
        tile<NV>(a, p.M, w2 + col, p.Dp, acc);
        for (int r = 0; r < kRows && r0 + r < cn; ++r) {
          float* yr = y + token[c0 + r0 + r] * D;
          const float s = weight[c0 + r0 + r];
          for (int v = 0; v < NV; ++v) {
            const int64_t c = col + v * kWidth;
            const Vec out = s * (b2 ? acc[r][v] + load(b2 + c) : acc[r][v]);
            if (c + kWidth <= D) {
              *reinterpret_cast<Vec*>(yr + c) += out;
            } else {
              for (int64_t i = 0; c + i < D; ++i) yr[c + i] += out[i];
            }
          }
        }
      }
    });
  }
}

}  // namespace
#pragma GCC pop_options

bool fused_units_available(const at::Tensor& x_TD) {
  return x_TD.is_cpu() && x_TD.scalar_type() == at::kFloat && simd_level() == SimdLevel::Avx512;
}

void fused_unit(const PackedUnits& p, int64_t u, const float* x, const int64_t* token, const float* weight, int64_t n,
                float* y, float* h) {
  fused_unit_avx512(p, u, x, token, weight, n, y, h);
}
#else
bool fused_units_available(const at::Tensor&) { return false; }
void fused_unit(const PackedUnits&, int64_t, const float*, const int64_t*, const float*, int64_t, float*, float*) {
  TORCH_CHECK(false, "fused_unit: no AVX-512 kernel in this build");
}
#endif

}  // namespace mf
