#include "model/small_attention.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/exp_poly.h"
#include "core/simd.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename T>
MF_ALWAYS_INLINE void axpy(T alpha, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

struct Shape {
  int64_t BH, queries, keys, Dh;
  bool causal;
  int64_t last_key(int64_t i) const { return causal ? i + keys - queries : keys - 1; }  // inclusive
};

// Where matrix m = (batch m / heads, head m % heads) and its rows lie in a tensor: rows of Dh
// contiguous elements, `row` apart. [B, H, queries, Dh] contiguous and the projection's packed
// [B, L, 3, H, Dh] (q, k, v at offsets 0, H Dh, 2 H Dh) are both such layouts.
struct Layout {
  int64_t heads, batch, head, row;
  int64_t at(int64_t m) const { return (m / heads) * batch + (m % heads) * head; }
};

Layout heads_major(const at::Tensor& t) {  // [B, H, queries, Dh] contiguous
  return {t.size(1), t.size(1) * t.size(2) * t.size(3), t.size(2) * t.size(3), t.size(3)};
}

struct Layouts {
  Layout q, k, v, o;  // the gradients take their tensor's layout
};

// Rows j of matrix m's keys (or values) as columns: kT[d * keys + j]. Scores and dP then come from
// axpy over j (vertical SIMD) instead of one horizontal dot reduction per (i, j) pair; with
// Dh = 24 the reductions were most of the kernel's time.
template <typename T>
MF_ALWAYS_INLINE void transpose_rows(const T* rows, int64_t row, int64_t keys, int64_t Dh, T* out) {
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < Dh; ++d) out[d * keys + j] = rows[j * row + d];
}

// s[j] = sum_d a[d] xT[d * keys + j] for j < n
template <typename T>
MF_ALWAYS_INLINE void row_times(const T* a, const T* xT, int64_t keys, int64_t n, int64_t Dh, T* s) {
  std::fill(s, s + n, T(0));
  for (int64_t d = 0; d < Dh; ++d) axpy(a[d], xT + d * keys, s, n);
}

template <typename T>
MF_ALWAYS_INLINE void forward_range(const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const T* q, const T* k,
                                    const T* v, T* p, T* o) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  std::vector<T> kT(s.Dh * s.keys), qi(s.Dh);
  for (int64_t m = m0; m < m1; ++m) {
    const T *qm = q + l.q.at(m), *vm = v + l.v.at(m);
    transpose_rows(k + l.k.at(m), l.k.row, s.keys, s.Dh, kT.data());
    for (int64_t i = 0; i < s.queries; ++i) {
      T* pi = p + (m * s.queries + i) * s.keys;
      T* oi = o + l.o.at(m) + i * l.o.row;
      const int64_t last = s.last_key(i);
      for (int64_t d = 0; d < s.Dh; ++d) qi[d] = scale * qm[i * l.q.row + d];
      row_times(qi.data(), kT.data(), s.keys, last + 1, s.Dh, pi);
      const T top = *std::max_element(pi, pi + last + 1);
      // the exponentials in a loop of their own, which vectorises through the shared polynomial
      // (std::exp inside the sum was a libm call per score)
#pragma omp simd
      for (int64_t j = 0; j <= last; ++j) pi[j] = exp_lanes(pi[j] - top);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= last; ++j) sum += pi[j];
      for (int64_t j = last + 1; j < s.keys; ++j) pi[j] = 0;
      std::fill(oi, oi + s.Dh, T(0));
      for (int64_t j = 0; j <= last; ++j) axpy(pi[j] /= sum, vm + j * l.v.row, oi, s.Dh);
    }
  }
}

MF_SIMD_FUNCTION(forward_matrices, forward_range,
                 (const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const float* q, const float* k,
                  const float* v, float* p, float* o),
                 (s, l, m0, m1, q, k, v, p, o))
MF_SIMD_FUNCTION(forward_matrices, forward_range,
                 (const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const double* q, const double* k,
                  const double* v, double* p, double* o),
                 (s, l, m0, m1, q, k, v, p, o))

template <typename T>
void forward_kernel(const Shape& s, const Layouts& l, const T* q, const T* k, const T* v, T* p, T* o) {
  at::parallel_for(0, s.BH, 1, [&](int64_t m0, int64_t m1) { forward_matrices(s, l, m0, m1, q, k, v, p, o); });
}

template <typename T>
MF_ALWAYS_INLINE void backward_range(const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const T* q, const T* k,
                                     const T* v, const T* p, const T* dout, T* dq, T* dk, T* dv) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  std::vector<T> ds(s.keys), vT(s.Dh * s.keys);
  for (int64_t m = m0; m < m1; ++m) {
    const T *qm = q + l.q.at(m), *km = k + l.k.at(m), *dom = dout + l.o.at(m);
    T *dqm = dq + l.q.at(m), *dkm = dk + l.k.at(m), *dvm = dv + l.v.at(m);
    transpose_rows(v + l.v.at(m), l.v.row, s.keys, s.Dh, vT.data());
    for (int64_t j = 0; j < s.keys; ++j) {
      std::fill(dkm + j * l.k.row, dkm + j * l.k.row + s.Dh, T(0));
      std::fill(dvm + j * l.v.row, dvm + j * l.v.row + s.Dh, T(0));
    }
    for (int64_t i = 0; i < s.queries; ++i) {
      const T* pi = p + (m * s.queries + i) * s.keys;
      const T* doi = dom + i * l.o.row;
      const int64_t last = s.last_key(i);
      row_times(doi, vT.data(), s.keys, last + 1, s.Dh, ds.data());  // dP_ij = dO_i . v_j
      T mean = 0;                                                    // sum_l P_il dP_il
      for (int64_t j = 0; j <= last; ++j) {
        mean += pi[j] * ds[j];
        axpy(pi[j], doi, dvm + j * l.v.row, s.Dh);
      }
      T* dqi = dqm + i * l.q.row;
      std::fill(dqi, dqi + s.Dh, T(0));
      for (int64_t j = 0; j <= last; ++j) {
        const T g = scale * pi[j] * (ds[j] - mean);
        axpy(g, km + j * l.k.row, dqi, s.Dh);
        axpy(g, qm + i * l.q.row, dkm + j * l.k.row, s.Dh);
      }
    }
  }
}

MF_SIMD_FUNCTION(backward_matrices, backward_range,
                 (const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const float* q, const float* k,
                  const float* v, const float* p, const float* dout, float* dq, float* dk, float* dv),
                 (s, l, m0, m1, q, k, v, p, dout, dq, dk, dv))
MF_SIMD_FUNCTION(backward_matrices, backward_range,
                 (const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const double* q, const double* k,
                  const double* v, const double* p, const double* dout, double* dq, double* dk, double* dv),
                 (s, l, m0, m1, q, k, v, p, dout, dq, dk, dv))

template <typename T>
void backward_kernel(const Shape& s, const Layouts& l, const T* q, const T* k, const T* v, const T* p, const T* dout,
                     T* dq, T* dk, T* dv) {
  at::parallel_for(0, s.BH, 1,
                   [&](int64_t m0, int64_t m1) { backward_matrices(s, l, m0, m1, q, k, v, p, dout, dq, dk, dv); });
}

// q, k, v, the output and the probabilities [BH, queries, keys]; the gradients of q, k, v
void run_forward(const Shape& s, const Layouts& l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 at::Tensor& p, at::Tensor& o) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "small_attention", [&] {
    forward_kernel<scalar_t>(s, l, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                             p.data_ptr<scalar_t>(), o.data_ptr<scalar_t>());
  });
}

void run_backward(const Shape& s, const Layouts& l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& p, const at::Tensor& dout, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "small_attention_backward", [&] {
    backward_kernel<scalar_t>(s, l, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                              p.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                              dk.data_ptr<scalar_t>(), dv.data_ptr<scalar_t>());
  });
}

struct SmallAttention : public torch::autograd::Function<SmallAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal) {
    const Shape s{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), causal};
    const Layouts l{heads_major(q), heads_major(k), heads_major(v), heads_major(q)};
    auto p = at::empty({q.size(0), q.size(1), s.queries, s.keys}, q.options());
    auto o = at::empty_like(q);
    run_forward(s, l, q, k, v, p, o);
    ctx->save_for_backward({q, k, v, p});
    ctx->saved_data["causal"] = causal;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &p = saved[3];
    const Shape s{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), ctx->saved_data["causal"].toBool()};
    const Layouts l{heads_major(q), heads_major(k), heads_major(v), heads_major(q)};
    auto dout = grads[0].contiguous();
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    run_backward(s, l, q, k, v, p, dout, dq, dk, dv);
    return {dq, dk, dv, at::Tensor()};
  }
};

// qkv [B, L, 3, H, Dh] -> [B, L, H, Dh]: q, k and v read in place, the output written in the
// layout the output projection takes, the gradient one [B, L, 3, H, Dh] tensor (no head
// transposes, no per-q/k/v gradient buffers to add up).
struct PackedAttention : public torch::autograd::Function<PackedAttention> {
  static Layouts layouts(const at::Tensor& qkv) {
    const int64_t L = qkv.size(1), H = qkv.size(3), Dh = qkv.size(4);
    const Layout in{H, L * 3 * H * Dh, Dh, 3 * H * Dh};
    return {in, in, in, Layout{H, L * H * Dh, Dh, H * Dh}};
  }
  static Shape shape(const at::Tensor& qkv, bool causal) {
    return {qkv.size(0) * qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4), causal};
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, bool causal) {
    const auto s = shape(qkv, causal);
    const int64_t B = qkv.size(0), L = qkv.size(1), H = qkv.size(3), Dh = qkv.size(4);
    auto p = at::empty({B * H, L, L}, qkv.options());
    auto o = at::empty({B, L, H, Dh}, qkv.options());
    auto q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);  // views: their data pointers
    run_forward(s, layouts(qkv), q, k, v, p, o);
    ctx->save_for_backward({qkv, p});
    ctx->saved_data["causal"] = causal;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &qkv = saved[0], &p = saved[1];
    const auto s = shape(qkv, ctx->saved_data["causal"].toBool());
    auto dout = grads[0].contiguous();
    auto dqkv = at::empty_like(qkv);
    auto dq = dqkv.select(2, 0), dk = dqkv.select(2, 1), dv = dqkv.select(2, 2);
    run_backward(s, layouts(qkv), qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), p, dout, dq, dk, dv);
    return {dqkv, at::Tensor()};
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

at::Tensor small_attention_packed(const at::Tensor& qkv_BL3HDh, bool causal) {
  TORCH_CHECK(qkv_BL3HDh.dim() == 5 && qkv_BL3HDh.size(2) == 3, "small_attention_packed: qkv ", qkv_BL3HDh.sizes(),
              " is not [B, L, 3, H, Dh]");
  TORCH_CHECK(qkv_BL3HDh.is_cpu(), "small_attention_packed: CPU tensors only");
  return PackedAttention::apply(qkv_BL3HDh.contiguous(), causal);
}

bool small_attention_applies(const at::Tensor& q, int64_t keys) {
  return q.is_cpu() && (keys <= 64 || (keys <= 512 && q.size(-1) <= 64));
}

}  // namespace mf
