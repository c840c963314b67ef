#include "core/bf16.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "core/bf16_lanes.h"
#include "core/row_kernel.h"
#include "core/tiles_linear.h"
#include "core/unit_gemm.h"

namespace mf {
namespace {

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
// 1.2 GB/s, slower than the GEMM it feeds): the GEMM does the work, on our unit GEMMs where they
// are taken (AVX-512: 256 rows of x by a [6144, 2048] weight 50-73 -> 19-22 ms, a driver; LibTorch's
// linear on a float32 copy of the weight 32 ms)
void widened_panels(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t rows = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(K, 1) / 2 * 2);
  auto panel = at::empty({std::min(rows, N), K}, x.options());
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n = std::min(rows, N - n0);
    const auto part = w.narrow(0, n0, n);
    at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) { widen_rows(part, r0, r1, panel.data_ptr<float>()); });
    auto dst = out.narrow(1, n0, n);
    const auto p = panel.narrow(0, 0, n);
    if (unit_gemm_preferred(x))
      dst.copy_(tiles_linear(x, p));
    else
      at::mm_out(dst, x, p.t());
  }
}

}  // namespace

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
