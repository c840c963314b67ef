#include "model/small_attention.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/exp_poly.h"
#include "core/simd.h"
#include "core/tiles.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Shape {
  int64_t BH, queries, keys, Dh;
  bool causal;
  int64_t last_key(int64_t i) const { return causal ? i + keys - queries : keys - 1; }  // inclusive
};

// Where matrix m = (batch m / heads, query head m % heads) and its rows lie in a tensor: rows of
// Dh contiguous elements, `row` apart; a tensor of kv heads holds query head h's at h / group.
// [B, H, queries, Dh] contiguous and the projection's packed [B, L, 3, H, Dh] (q, k, v at offsets
// 0, H Dh, 2 H Dh) are both such layouts.
struct Layout {
  int64_t heads, batch, head, row, group = 1;
  int64_t at(int64_t m) const { return (m / heads) * batch + (m % heads) / group * head; }
};

// [B, H / group, queries, Dh] contiguous, read by the H query heads
Layout heads_major(const at::Tensor& t, int64_t group = 1) {
  return {t.size(1) * group, t.size(1) * t.size(2) * t.size(3), t.size(2) * t.size(3), t.size(3), group};
}

struct Layouts {
  Layout q, k, v, o;  // the gradients take their tensor's layout
};

// The four products of a matrix m run as register tiles (core/tiles.h): kRows rows x kCols
// columns of sums, each kept in registers over the whole depth. An operand read by rows of
// columns (x below) is copied once per matrix into a buffer padded with zeros to whole tiles.
constexpr int kRows = 6;
constexpr int64_t kCols = 16;
int64_t padded(int64_t n) { return (n + kCols - 1) / kCols * kCols; }

// the first Dh numbers of n rows `row` apart into out [n, ld], or transposed into out [Dh, ld]
template <typename T>
MF_ALWAYS_INLINE void copy_rows(const T* rows, int64_t row, int64_t n, int64_t Dh, T* out, int64_t ld) {
  for (int64_t j = 0; j < n; ++j) std::copy(rows + j * row, rows + j * row + Dh, out + j * ld);
}
template <typename T>
MF_ALWAYS_INLINE void transpose_rows(const T* rows, int64_t row, int64_t n, int64_t Dh, T* out, int64_t ld) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < Dh; ++d) out[d * ld + j] = rows[j * row + d];
}

template <typename T>
struct Tile {
  static constexpr int W = 32 / sizeof(T), NV = kCols / W;  // 256-bit vectors (see core/simd.h)
  using Vec = typename tiles::Lanes<W, T>::Vec;
  Vec acc[kRows][NV];
  // columns [c0, c0 + n) of the first `rows` rows, n <= kCols, written or added
  MF_ALWAYS_INLINE void store(T* const (&out)[kRows], int64_t rows, int64_t c0, int64_t n, bool add = false) const {
    for (int64_t r = 0; r < rows; ++r) {
      if (n == kCols && !add) {
        for (int v = 0; v < NV; ++v) tiles::store<W>(out[r] + c0 + v * W, acc[r][v]);
        continue;
      }
      T part[kCols];
      for (int v = 0; v < NV; ++v) tiles::store<W>(part + v * W, acc[r][v]);
      T* o = out[r] + c0;
      if (add)
        for (int64_t c = 0; c < n; ++c) o[c] += part[c];
      else
        std::copy(part, part + n, o);
    }
  }
};

// out[r][c] = sum_{t < depth} a[r][t] x[t ld + c], c < cols (x's rows padded to whole tiles)
template <typename T, typename Row>
MF_ALWAYS_INLINE void rows_times(Row const (&a)[kRows], int64_t depth, const T* x, int64_t ld, int64_t cols,
                                 T* const (&out)[kRows], int64_t rows) {
  const T* in[kRows];
  std::copy(a, a + kRows, in);
  Tile<T> t;
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    tiles::tile<Tile<T>::W, kRows, Tile<T>::NV>(in, depth, x + c0, ld, t.acc);
    t.store(out, rows, c0, std::min(kCols, cols - c0));
  }
}

// the same with a read by depth: out[r][c] (+)= sum_{t < depth} a[t][off[r]] x[t ld + c]
template <typename T>
MF_ALWAYS_INLINE void depth_times(const T* const* a, const int64_t (&off)[kRows], int64_t depth, const T* x, int64_t ld,
                                  int64_t cols, T* const (&out)[kRows], int64_t rows, bool add) {
  Tile<T> t;
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    tiles::tile_by_depth<Tile<T>::W, kRows, Tile<T>::NV>(a, off, depth, x + c0, ld, t.acc);
    t.store(out, rows, c0, std::min(kCols, cols - c0), add);
  }
}

// the kRows rows from `first` of a matrix whose rows lie `row` apart (the last repeated past n)
template <typename T>
MF_ALWAYS_INLINE void block_rows(T* base, int64_t row, int64_t first, int64_t n, T* (&out)[kRows]) {
  for (int r = 0; r < kRows; ++r) out[r] = base + std::min<int64_t>(first + r, n - 1) * row;
}

// p_i = softmax(scale s_i) over keys j <= last, zeros after it up to `keys`
template <typename T>
MF_ALWAYS_INLINE void softmax_row(const T* s, T scale, int64_t last, int64_t keys, T* p) {
#pragma omp simd
  for (int64_t j = 0; j <= last; ++j) p[j] = scale * s[j];
  const T top = *std::max_element(p, p + last + 1);
  // the exponentials in a loop of their own, which vectorises through the shared polynomial
#pragma omp simd
  for (int64_t j = 0; j <= last; ++j) p[j] = exp_lanes(p[j] - top);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j <= last; ++j) sum += p[j];
#pragma omp simd
  for (int64_t j = 0; j <= last; ++j) p[j] /= sum;
  std::fill(p + last + 1, p + keys, T(0));
}

// S = Q K^T, P = softmax(scale S) row by row, O = P V
template <typename T>
MF_ALWAYS_INLINE void forward_range(const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const T* q, const T* k,
                                    const T* v, T* p, T* o) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  const int64_t nP = padded(s.keys), DhP = padded(s.Dh);
  std::vector<T> kT(s.Dh * nP), vP(s.keys * DhP), scores(kRows * nP);
  T* score_rows[kRows];
  block_rows(scores.data(), nP, 0, kRows, score_rows);
  for (int64_t m = m0; m < m1; ++m) {
    transpose_rows(k + l.k.at(m), l.k.row, s.keys, s.Dh, kT.data(), nP);
    copy_rows(v + l.v.at(m), l.v.row, s.keys, s.Dh, vP.data(), DhP);
    T* pm = p + m * s.queries * s.keys;
    for (int64_t i0 = 0; i0 < s.queries; i0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, s.queries - i0), span = s.last_key(i0 + rows - 1) + 1;
      const T* q_rows[kRows];
      T *p_rows[kRows], *o_rows[kRows];
      block_rows(q + l.q.at(m), l.q.row, i0, s.queries, q_rows);
      block_rows(pm, s.keys, i0, s.queries, p_rows);
      block_rows(o + l.o.at(m), l.o.row, i0, s.queries, o_rows);
      rows_times(q_rows, s.Dh, kT.data(), nP, span, score_rows, rows);
      for (int64_t r = 0; r < rows; ++r) softmax_row(score_rows[r], scale, s.last_key(i0 + r), s.keys, p_rows[r]);
      rows_times(p_rows, span, vP.data(), DhP, s.Dh, o_rows, rows);
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

// dP = dO V^T; G = scale P o (dP - rowsum(P o dP)); dQ = G K; dV = P^T dO; dK = G^T Q, the query
// heads of a kv head (m0 and m1 whole groups of them) adding into its dK and dV in turn
template <typename T>
MF_ALWAYS_INLINE void backward_range(const Shape& s, const Layouts& l, int64_t m0, int64_t m1, const T* q, const T* k,
                                     const T* v, const T* p, const T* dout, T* dq, T* dk, T* dv) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.Dh)));
  const int64_t nP = padded(s.keys), DhP = padded(s.Dh);
  std::vector<T> vT(s.Dh * nP), kP(s.keys * DhP), qP(s.queries * DhP), doP(s.queries * DhP), dp(kRows * nP),
      g(s.queries * nP);
  std::vector<const T*> p_by_query(s.queries), g_by_query(s.queries);
  T* dp_rows[kRows];
  block_rows(dp.data(), nP, 0, kRows, dp_rows);
  for (int64_t i = 0; i < s.queries; ++i) g_by_query[i] = g.data() + i * nP;
  for (int64_t m = m0; m < m1; ++m) {
    transpose_rows(v + l.v.at(m), l.v.row, s.keys, s.Dh, vT.data(), nP);
    copy_rows(k + l.k.at(m), l.k.row, s.keys, s.Dh, kP.data(), DhP);
    copy_rows(q + l.q.at(m), l.q.row, s.queries, s.Dh, qP.data(), DhP);
    copy_rows(dout + l.o.at(m), l.o.row, s.queries, s.Dh, doP.data(), DhP);
    const T* pm = p + m * s.queries * s.keys;
    for (int64_t i = 0; i < s.queries; ++i) p_by_query[i] = pm + i * s.keys;
    for (int64_t i0 = 0; i0 < s.queries; i0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, s.queries - i0), span = s.last_key(i0 + rows - 1) + 1;
      T *do_rows[kRows], *g_rows[kRows], *dq_rows[kRows];
      block_rows(doP.data(), DhP, i0, s.queries, do_rows);
      block_rows(g.data(), nP, i0, s.queries, g_rows);
      block_rows(dq + l.q.at(m), l.q.row, i0, s.queries, dq_rows);
      rows_times(do_rows, s.Dh, vT.data(), nP, span, dp_rows, rows);
      for (int64_t r = 0; r < rows; ++r) {
        const T *pi = p_by_query[i0 + r], *dpi = dp_rows[r];
        const int64_t last = s.last_key(i0 + r);
        T mean = 0;  // sum_l P_il dP_il
#pragma omp simd reduction(+ : mean)
        for (int64_t j = 0; j <= last; ++j) mean += pi[j] * dpi[j];
        T* gi = g_rows[r];
#pragma omp simd
        for (int64_t j = 0; j <= last; ++j) gi[j] = scale * pi[j] * (dpi[j] - mean);
        std::fill(gi + last + 1, gi + s.keys, T(0));
      }
      rows_times(g_rows, span, kP.data(), DhP, s.Dh, dq_rows, rows);
    }
    for (int64_t j0 = 0; j0 < s.keys; j0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, s.keys - j0);
      const int64_t first = s.causal ? std::max<int64_t>(0, j0 - (s.keys - s.queries)) : 0;  // queries before see none
      int64_t off[kRows];
      for (int r = 0; r < kRows; ++r) off[r] = std::min<int64_t>(j0 + r, s.keys - 1);
      T *dv_rows[kRows], *dk_rows[kRows];
      block_rows(dv + l.v.at(m), l.v.row, j0, s.keys, dv_rows);
      block_rows(dk + l.k.at(m), l.k.row, j0, s.keys, dk_rows);
      const int64_t depth = s.queries - first;
      const bool add = m % l.k.group != 0;
      depth_times(p_by_query.data() + first, off, depth, doP.data() + first * DhP, DhP, s.Dh, dv_rows, rows, add);
      depth_times(g_by_query.data() + first, off, depth, qP.data() + first * DhP, DhP, s.Dh, dk_rows, rows, add);
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

// threads take whole groups of query heads: each kv head's dK and dV have one writer
template <typename T>
void backward_kernel(const Shape& s, const Layouts& l, const T* q, const T* k, const T* v, const T* p, const T* dout,
                     T* dq, T* dk, T* dv) {
  const int64_t group = l.k.group;
  at::parallel_for(0, s.BH / group, 1, [&](int64_t u0, int64_t u1) {
    backward_matrices(s, l, u0 * group, u1 * group, q, k, v, p, dout, dq, dk, dv);
  });
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
  static Layouts layouts(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const int64_t group = q.size(1) / k.size(1);
    return {heads_major(q), heads_major(k, group), heads_major(v, group), heads_major(q)};
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal) {
    const Shape s{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), causal};
    const Layouts l = layouts(q, k, v);
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
    const Layouts l = layouts(q, k, v);
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
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0 && q.size(3) == k.size(3) && k.size(2) >= q.size(2),
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
