#include "model/small_attention.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
void axpy(T alpha, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

struct Shape {
  int64_t BH, N, S, Dh;
  bool causal;
  int64_t last_key(int64_t i) const { return causal ? i + S - N : S - 1; }  // inclusive
};

template <typename T>
void forward_kernel(const Shape& s, const T* q, const T* k, const T* v, T* p, T* o) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  at::parallel_for(0, s.BH, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const T *qm = q + m * s.N * s.Dh, *km = k + m * s.S * s.Dh, *vm = v + m * s.S * s.Dh;
      for (int64_t i = 0; i < s.N; ++i) {
        T* pi = p + (m * s.N + i) * s.S;
        T* oi = o + (m * s.N + i) * s.Dh;
        const int64_t last = s.last_key(i);
        T top = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= last; ++j)
          top = std::max(top, pi[j] = scale * dot(qm + i * s.Dh, km + j * s.Dh, s.Dh));
        T sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += pi[j] = std::exp(pi[j] - top);
        for (int64_t j = last + 1; j < s.S; ++j) pi[j] = 0;
        std::fill(oi, oi + s.Dh, T(0));
        for (int64_t j = 0; j <= last; ++j) axpy(pi[j] /= sum, vm + j * s.Dh, oi, s.Dh);
      }
    }
  });
}

template <typename T>
void backward_kernel(const Shape& s, const T* q, const T* k, const T* v, const T* p, const T* dout, T* dq, T* dk,
                     T* dv) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  at::parallel_for(0, s.BH, 1, [&](int64_t m0, int64_t m1) {
    std::vector<T> ds(s.S);
    for (int64_t m = m0; m < m1; ++m) {
      const T *qm = q + m * s.N * s.Dh, *km = k + m * s.S * s.Dh, *vm = v + m * s.S * s.Dh;
      T *dqm = dq + m * s.N * s.Dh, *dkm = dk + m * s.S * s.Dh, *dvm = dv + m * s.S * s.Dh;
      std::fill(dkm, dkm + s.S * s.Dh, T(0));
      std::fill(dvm, dvm + s.S * s.Dh, T(0));
      for (int64_t i = 0; i < s.N; ++i) {
        const T* pi = p + (m * s.N + i) * s.S;
        const T* doi = dout + (m * s.N + i) * s.Dh;
        const int64_t last = s.last_key(i);
        T mean = 0;  // sum_l P_il dP_il
        for (int64_t j = 0; j <= last; ++j) {
          ds[j] = dot(doi, vm + j * s.Dh, s.Dh);
          mean += pi[j] * ds[j];
          axpy(pi[j], doi, dvm + j * s.Dh, s.Dh);
        }
        T* dqi = dqm + i * s.Dh;
        std::fill(dqi, dqi + s.Dh, T(0));
        for (int64_t j = 0; j <= last; ++j) {
          const T g = scale * pi[j] * (ds[j] - mean);
          axpy(g, km + j * s.Dh, dqi, s.Dh);
          axpy(g, qm + i * s.Dh, dkm + j * s.Dh, s.Dh);
        }
      }
    }
  });
}

Shape shape_of(const at::Tensor& q, const at::Tensor& k, bool causal) {
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), causal};
}

struct SmallAttention : public torch::autograd::Function<SmallAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal) {
    const auto s = shape_of(q, k, causal);
    auto p = at::empty({q.size(0), q.size(1), s.N, s.S}, q.options());
    auto o = at::empty_like(q);
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "small_attention", [&] {
      forward_kernel<scalar_t>(s, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                               p.data_ptr<scalar_t>(), o.data_ptr<scalar_t>());
    });
    ctx->save_for_backward({q, k, v, p});
    ctx->saved_data["causal"] = causal;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &p = saved[3];
    const auto s = shape_of(q, k, ctx->saved_data["causal"].toBool());
    auto dout = grads[0].contiguous();
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "small_attention_backward", [&] {
      backward_kernel<scalar_t>(s, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                p.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                                dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>());
    });
    return {dq, dk, dv, at::Tensor()};
  }
};

}  // namespace

at::Tensor small_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                  q.size(3) == k.size(3) && k.size(2) >= q.size(2),
              "small_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(q.is_cpu(), "small_attention: CPU tensors only");
  return SmallAttention::apply(q.contiguous(), k.contiguous(), v.contiguous(), causal);
}

bool small_attention_applies(const at::Tensor& q, int64_t keys) { return q.is_cpu() && keys <= 64; }

}  // namespace mf
