#include "serve/decode_parts.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/bf16.h"
#include "core/exp_poly.h"
#include "core/row_kernel.h"
#include "core/simd.h"

namespace mf::decoding {

const float* floats(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "decode engine: a ", t.sizes(), " ", t.scalar_type(),
              " tensor where a contiguous float32 one was expected");
  return t.data_ptr<float>();
}

bool held_weight(at::ScalarType t) { return t == at::kFloat || held_narrow(t); }

Matrix matrix(const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(w.dim() == 2 && w.stride(1) == 1 && held_weight(w.scalar_type()), "decode engine: a ", w.sizes(), " ",
              w.scalar_type(), " weight with strided rows");
  Matrix m;
  m.dtype = w.scalar_type();
  if (m.dtype == at::kChar) m.q8 = q8_of(w);
  m.data = w.data_ptr();
  m.N = w.size(0), m.K = w.size(1), m.ld = w.stride(0);
  m.bias = floats(b);
  return m;
}

void times(const Team& team, const Matrix& w, const float* x, int64_t M, float* y) {
  const auto [n0, n1] = team.columns(w.N);
  times(w, x, M, y, n0, n1);
}

void times(const Matrix& w, const float* x, int64_t M, float* y, int64_t n0, int64_t n1) {
  if (n0 >= n1 || M == 0) return;
  if (w.dtype == at::kBFloat16)
    rows_part(x, w.K, M, w.K, static_cast<const uint16_t*>(w.data), w.ld, n0, n1, y, w.N);
  else if (w.dtype == at::kChar)
    rows_part(x, w.K, M, w.K, w.q8, w.ld, n0, n1, y, w.N);
  else
    rows_part(x, w.K, M, w.K, static_cast<const float*>(w.data), w.ld, n0, n1, y, w.N);
  if (w.bias)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) y[m * w.N + n] += w.bias[n];
}

void rms_norm(const float* x, int64_t n, const float* weight, double eps, float* out) {
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * weight[i];
}

// act(g) [* u] in place of g for n numbers (SwiGLU when `u`, else exact GELU), through the shared
// polynomials, which vectorise (std::exp and std::erf were a libm call per number)
MF_ALWAYS_INLINE void activate_body(float* g, const float* u, int64_t n) {
  if (u) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) g[i] = silu_times(g[i], u[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) g[i] *= gelu_phi(g[i]);
  }
}
MF_SIMD_FUNCTION(activate_range, activate_body, (float* g, const float* u, int64_t n), (g, u, n))

void activate(float* g, const float* u, int64_t rows, int64_t ld, int64_t c0, int64_t c1) {
  if (c0 >= c1) return;
  for (int64_t r = 0; r < rows; ++r) activate_range(g + r * ld + c0, u ? u + r * ld + c0 : nullptr, c1 - c0);
}

void Routed::group(const std::vector<std::vector<std::pair<int64_t, float>>>& picks, int64_t M, int64_t E,
                   const float* h, int64_t D) {
  offsets.assign(E + 1, 0);  // a counting sort by unit, rows in order within each
  for (int64_t m = 0; m < M; ++m)
    for (auto [e, w] : picks[m]) ++offsets[e + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  row.resize(offsets[E]), weight.resize(offsets[E]);
  for (int64_t m = 0; m < M; ++m)  // offsets[e] runs through unit e's pairs, ending at its end
    for (auto [e, w] : picks[m]) row[offsets[e]] = m, weight[offsets[e]++] = w;
  for (int64_t e = E; e > 0; --e) offsets[e] = offsets[e - 1];  // back to each unit's start
  offsets[0] = 0;
  if (static_cast<int64_t>(in.size()) < pairs() * D) in.resize(pairs() * D);
  for (int64_t p = 0; p < pairs(); ++p) std::copy_n(h + row[p] * D, D, &in[p * D]);
}

void Router::pick(const float* logits, std::vector<float>& score, std::vector<int64_t>& order,
                  std::vector<std::pair<int64_t, float>>& out) const {
  const int64_t E = w.N;
  if (kind == RouterKind::SoftmaxTopK) {
    const float top = *std::max_element(logits, logits + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += score[e] = std::exp(logits[e] - top);
    for (int64_t e = 0; e < E; ++e) score[e] /= sum;
  } else if (kind == RouterKind::SigmoidTopK) {
    for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    double squares = 0;
    for (int64_t e = 0; e < E; ++e) squares += static_cast<double>(logits[e]) * logits[e];
    const float norm = static_cast<float>(std::sqrt(squares) + norm_eps);
    for (int64_t e = 0; e < E; ++e) score[e] = std::max(logits[e] / norm, 0.0f) * norm_factor;
  }
  auto key = [&](int64_t e) { return score[e] + (selection_bias ? selection_bias[e] : 0.0f); };
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                    [&](int64_t a, int64_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
  float sum = 0;
  for (int64_t i = 0; i < top_k; ++i) sum += score[order[i]];
  if (kind == RouterKind::NormTopK) sum = std::max(sum, 1e-30f);
  out.clear();
  for (int64_t i = 0; i < top_k; ++i)
    out.emplace_back(order[i], (renormalize ? score[order[i]] / sum : score[order[i]]) * scale);
}
// out [Dh] = softmax(scale p_j) . value_j over the S cached positions j (rows `stride` apart), p the
// dot products q . key_j (overwritten). The exponentials run in a loop of their own through the
// shared polynomial, which vectorises (std::exp inside the sum was a libm call per position).
MF_ALWAYS_INLINE void softmax_values_body(float* p, const float* value, int64_t S, int64_t Dh, int64_t stride,
                                          float scale, float* out) {
  float top = -INFINITY, sum = 0;
#pragma omp simd
  for (int64_t j = 0; j < S; ++j) p[j] *= scale;
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < S; ++j) top = p[j] > top ? p[j] : top;
#pragma omp simd
  for (int64_t j = 0; j < S; ++j) p[j] = exp_lanes(p[j] - top);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < S; ++j) sum += p[j];
  const float inv = 1.0f / sum;
  // 32 outputs at a time in registers (a loop over out[] in memory waited on each store)
  int64_t d0 = 0;
  for (; d0 + 32 <= Dh; d0 += 32) {
    float acc[32] = {};
    for (int64_t j = 0; j < S; ++j) {
      const float w = p[j] * inv;
#pragma omp simd
      for (int d = 0; d < 32; ++d) acc[d] += w * value[j * stride + d0 + d];
    }
    std::copy_n(acc, 32, out + d0);
  }
  std::fill(out + d0, out + Dh, 0.0f);
  for (int64_t j = 0; j < S && d0 < Dh; ++j) {
    const float w = p[j] * inv;
    for (int64_t d = d0; d < Dh; ++d) out[d] += w * value[j * stride + d];
  }
}

MF_SIMD_FUNCTION(softmax_values, softmax_values_body,
                 (float* p, const float* value, int64_t S, int64_t Dh, int64_t stride, float scale, float* out),
                 (p, value, S, Dh, stride, scale, out))

}  // namespace mf::decoding
