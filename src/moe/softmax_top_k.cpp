#include "moe/softmax_top_k.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>

#include "core/exp_poly.h"
#include "core/simd.h"
#include "moe/select_rows.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kGrain = 64;  // tokens a thread takes at least

// p_t = softmax(z_t), lse_t = logsumexp(z_t) for tokens [t0, t1)
template <typename T>
MF_ALWAYS_INLINE void softmax_rows(const T* z, int64_t t0, int64_t t1, int64_t E, T* p, T* lse) {
  for (int64_t t = t0; t < t1; ++t) {
    const T* zt = z + t * E;
    T* pt = p + t * E;
    T top = zt[0];
    for (int64_t j = 1; j < E; ++j) top = zt[j] > top ? zt[j] : top;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < E; ++j) sum += pt[j] = exp_lanes(zt[j] - top);
#pragma omp simd
    for (int64_t j = 0; j < E; ++j) pt[j] /= sum;
    lse[t] = top + std::log(sum);
  }
}
MF_SIMD_FUNCTION(softmax_kernel, softmax_rows,
                 (const float* z, int64_t t0, int64_t t1, int64_t E, float* p, float* lse), (z, t0, t1, E, p, lse))
MF_SIMD_FUNCTION(softmax_kernel, softmax_rows,
                 (const double* z, int64_t t0, int64_t t1, int64_t E, double* p, double* lse), (z, t0, t1, E, p, lse))

struct Grads {  // the three outputs' gradients for tokens [t0, t1); null where a gradient is undefined
  const void *dprobs, *dweight, *dlse;
};

// dz_t = p_t o (dp_t - <p_t, dp_t> + dlse_t), dp_t = dprobs_t + the weights' gradient at index_t
template <typename T>
MF_ALWAYS_INLINE void backward_rows(const T* p, const int64_t* index, const Grads& g, int64_t t0, int64_t t1, int64_t E,
                                    int64_t K, bool renormalize, T* dz) {
  const auto* dprobs = static_cast<const T*>(g.dprobs);
  const auto* dweight = static_cast<const T*>(g.dweight);
  const auto* dlse = static_cast<const T*>(g.dlse);
  for (int64_t t = t0; t < t1; ++t) {
    const T* pt = p + t * E;
    T* gt = dz + t * E;
    for (int64_t j = 0; j < E; ++j) gt[j] = dprobs ? dprobs[t * E + j] : T(0);
    if (dweight) {
      const int64_t* it = index + t * K;
      const T* dw = dweight + t * K;
      T sum = 1, dot = 0;  // S = sum_i p[index_i]; dot = sum_i dw_i w_i
      if (renormalize) {
        sum = 0;
        for (int64_t i = 0; i < K; ++i) sum += pt[it[i]];
        for (int64_t i = 0; i < K; ++i) dot += dw[i] * (pt[it[i]] / sum);
      }
      for (int64_t i = 0; i < K; ++i) gt[it[i]] += (dw[i] - dot) / sum;
    }
    T mean = 0;
#pragma omp simd reduction(+ : mean)
    for (int64_t j = 0; j < E; ++j) mean += pt[j] * gt[j];
    const T shift = (dlse ? dlse[t] : T(0)) - mean;
#pragma omp simd
    for (int64_t j = 0; j < E; ++j) gt[j] = pt[j] * (gt[j] + shift);
  }
}
MF_SIMD_FUNCTION(backward_rows_kernel, backward_rows,
                 (const float* p, const int64_t* index, const Grads& g, int64_t t0, int64_t t1, int64_t E, int64_t K,
                  bool renormalize, float* dz),
                 (p, index, g, t0, t1, E, K, renormalize, dz))
MF_SIMD_FUNCTION(backward_rows_kernel, backward_rows,
                 (const double* p, const int64_t* index, const Grads& g, int64_t t0, int64_t t1, int64_t E, int64_t K,
                  bool renormalize, double* dz),
                 (p, index, g, t0, t1, E, K, renormalize, dz))

template <typename T>
void weights_of(const T* p, const int64_t* index, int64_t tokens, int64_t E, int64_t K, bool renormalize, T* w) {
  at::parallel_for(0, tokens, kGrain * 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t* it = index + t * K;
      T sum = 0;
      for (int64_t i = 0; i < K; ++i) sum += w[t * K + i] = p[t * E + it[i]];
      if (renormalize)
        for (int64_t i = 0; i < K; ++i) w[t * K + i] /= sum;
    }
  });
}

const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

struct SoftmaxTopKFn : public torch::autograd::Function<SoftmaxTopKFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& z, int64_t K, bool renormalize,
                               const at::Tensor& bias) {
    const int64_t T = z.size(0), E = z.size(1);
    auto p = at::empty_like(z), lse = at::empty({T}, z.options()), w = at::empty({T, K}, z.options());
    at::Tensor index;
    AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "softmax_top_k", [&] {
      const scalar_t* zd = z.data_ptr<scalar_t>();
      scalar_t *pd = p.data_ptr<scalar_t>(), *ld = lse.data_ptr<scalar_t>();
      at::parallel_for(0, T, kGrain, [&](int64_t t0, int64_t t1) { softmax_kernel(zd, t0, t1, E, pd, ld); });
      index = top_k_index(bias.numel() ? p + bias.to(p.dtype()) : p, K);
      weights_of(pd, index.data_ptr<int64_t>(), T, E, K, renormalize, w.data_ptr<scalar_t>());
    });
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({index});
    ctx->save_for_backward({p, index});
    ctx->saved_data["renormalize"] = renormalize;
    return {p, index, w, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &p = saved[0], &index = saved[1];
    const int64_t T = p.size(0), E = p.size(1), K = index.size(1);
    const bool renormalize = ctx->saved_data["renormalize"].toBool();
    const auto dense = [](const at::Tensor& g) { return g.defined() ? g.contiguous() : g; };
    const auto dprobs = dense(grads[0]), dweight = dense(grads[2]), dlse = dense(grads[3]);
    auto dz = at::empty_like(p);
    const Grads g{data_or_null(dprobs), data_or_null(dweight), data_or_null(dlse)};
    AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "softmax_top_k_backward", [&] {
      const scalar_t* pd = p.data_ptr<scalar_t>();
      scalar_t* dzd = dz.data_ptr<scalar_t>();
      const int64_t* id = index.data_ptr<int64_t>();
      at::parallel_for(0, T, kGrain, [&](int64_t t0, int64_t t1) {
        backward_rows_kernel(pd, id, g, t0, t1, E, K, renormalize, dzd);
      });
    });
    return {dz, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool softmax_top_k_applies(const at::Tensor& logits_TE) {
  const auto dtype = logits_TE.scalar_type();
  return logits_TE.is_cpu() && logits_TE.dim() == 2 && (dtype == at::kFloat || dtype == at::kDouble);
}

SoftmaxTopK softmax_top_k(const at::Tensor& logits_TE, int64_t K, bool renormalize, const at::Tensor& bias_E) {
  TORCH_CHECK(softmax_top_k_applies(logits_TE), "softmax_top_k: need float32 or float64 CPU logits [T, E], got ",
              logits_TE.sizes(), " ", logits_TE.scalar_type());
  TORCH_CHECK(K >= 1 && K <= logits_TE.size(1), "softmax_top_k: need 1 <= K <= E, got K ", K);
  const auto bias = bias_E.defined() ? bias_E : at::empty({0}, logits_TE.options());
  auto out = SoftmaxTopKFn::apply(logits_TE.contiguous(), K, renormalize, bias);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace mf
