#include "serve/sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "core/exp_poly.h"
#include "core/simd.h"

namespace mf {
namespace {

// e[i] = exp((logits[i] - top) / T), 0 for a -inf logit
MF_ALWAYS_INLINE void scaled_exp_body(const float* logits, int64_t V, float top, float inv_t, float* e) {
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) e[i] = logits[i] == -INFINITY ? 0.0f : exp_lanes((logits[i] - top) * inv_t);
}
MF_SIMD_FUNCTION(scaled_exp, scaled_exp_body, (const float* logits, int64_t V, float top, float inv_t, float* e),
                 (logits, V, top, inv_t, e))

MF_ALWAYS_INLINE int32_t prob_key(float e) { return __builtin_bit_cast(int32_t, e); }  // ordered as e >= 0 is

// *out = the sum of the e[i] whose key is above k
// (32 partial sums: one vector's sum waited on each add)
MF_ALWAYS_INLINE void mass_above_body(const float* e, int64_t V, int32_t k, double* out) {
  float part[32] = {};
  int64_t i = 0;
  for (; i + 32 <= V; i += 32)
#pragma omp simd
    for (int j = 0; j < 32; ++j) part[j] += prob_key(e[i + j]) > k ? e[i + j] : 0.0f;
  double s = 0;
  for (; i < V; ++i) s += prob_key(e[i]) > k ? e[i] : 0.0f;
  for (float p : part) s += p;
  *out = s;
}
MF_SIMD_FUNCTION(mass_above, mass_above_body, (const float* e, int64_t V, int32_t k, double* out), (e, V, k, out))

double mass_over(const float* e, int64_t V, int32_t k) {
  double s;
  mass_above(e, V, k, &s);
  return s;
}

// The nucleus of e: every token whose key is above `edge`, and those at `edge` up to index
// `last_tie` (ties in index order while the mass before each is below top_p's)
MF_ALWAYS_INLINE bool in_nucleus(int64_t i, float e, int32_t edge, int32_t last_tie) {
  return prob_key(e) > edge || (prob_key(e) == edge && i <= last_tie);
}
struct Nucleus {
  int32_t edge = -1, last_tie = -1;  // top-p 1: every token
  bool keeps(int64_t i, float e) const { return in_nucleus(i, e, edge, last_tie); }
};

// The first tie at key v has mass_over(v) before it: kept when that is below top_p's mass.
// mass_over() falls as v rises, so the smallest key k0 with mass_over(k0) < mass is found by
// halving, and the edge is the smallest key present at or above it.
Nucleus nucleus(const float* e, int64_t V, double total, double top_p) {
  Nucleus n;
  if (top_p >= 1) return n;
  const double mass = top_p * total;
  int32_t lo = 0, hi = prob_key(1.0f) + 1;  // e <= 1: mass_over(hi) = 0
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (mass_over(e, V, mid) < mass)
      hi = mid;
    else
      lo = mid + 1;
  }
  n.edge = INT32_MAX;
  for (int64_t i = 0; i < V; ++i)
    if (prob_key(e[i]) >= lo && prob_key(e[i]) < n.edge) n.edge = prob_key(e[i]);
  double before = mass_over(e, V, n.edge);
  for (int64_t i = 0; i < V && before < mass; ++i)
    if (prob_key(e[i]) == n.edge) n.last_tie = static_cast<int32_t>(i), before += e[i];
  return n;
}

// sums[b] = the kept e of block b (kBlock numbers), the blocks covering V
constexpr int64_t kBlock = 64;
MF_ALWAYS_INLINE void kept_sums_body(const float* e, int64_t V, int32_t edge, int32_t last_tie, float* sums) {
  for (int64_t b = 0; b * kBlock < V; ++b) {
    const int64_t i0 = b * kBlock, i1 = std::min(V, i0 + kBlock);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += in_nucleus(i, e[i], edge, last_tie) ? e[i] : 0.0f;
    sums[b] = s;
  }
}
MF_SIMD_FUNCTION(kept_sums, kept_sums_body, (const float* e, int64_t V, int32_t edge, int32_t last_tie, float* sums),
                 (e, V, edge, last_tie, sums))

// e (this thread's buffer) for the logits, their sum and the nucleus
struct Weights {
  std::vector<float>& e;
  double total = 0;
  Nucleus n;
};

// the largest logit
MF_ALWAYS_INLINE void top_logit_body(const float* logits, int64_t V, float* out) {
  float top = -INFINITY;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < V; ++i) top = logits[i] > top ? logits[i] : top;
  *out = top;
}
MF_SIMD_FUNCTION(top_logit, top_logit_body, (const float* logits, int64_t V, float* out), (logits, V, out))

Weights weights(const float* logits, int64_t V, double temperature, double top_p) {
  thread_local std::vector<float> buf;
  buf.resize(V);
  float top;
  top_logit(logits, V, &top);
  scaled_exp(logits, V, top, static_cast<float>(1.0 / temperature), buf.data());
  Weights w{buf, mass_over(buf.data(), V, 0), {}};
  if (top == INFINITY || !(w.total > 0) || !std::isfinite(w.total))  // a NaN or +inf logit, or all -inf
    for (int64_t i = 0; i <= V; ++i)
      TORCH_CHECK(i < V && !std::isnan(logits[i]) && logits[i] != INFINITY, "sampling: ",
                  i < V ? fmt::format("logit {} is {}", i, logits[i]) : std::string("every logit is -inf"));
  w.n = nucleus(buf.data(), V, w.total, top_p);
  return w;
}

double uniform(at::Generator& gen) {
  auto* g = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return static_cast<double>(g->random64() >> 11) * 0x1.0p-53;
}

}  // namespace

void nucleus_probs(const float* logits, int64_t V, double temperature, double top_p, double* probs) {
  const auto w = weights(logits, V, temperature, top_p);
  double kept = 0;
  for (int64_t i = 0; i < V; ++i) kept += probs[i] = w.n.keeps(i, w.e[i]) ? w.e[i] : 0.0;
  for (int64_t i = 0; i < V; ++i) probs[i] /= kept;
}

// u uniform below the kept mass; the block where the running sum passes it, then its token
int64_t sample_token(const float* logits, int64_t V, double temperature, double top_p, at::Generator& gen) {
  const auto w = weights(logits, V, temperature, top_p);
  if (w.n.edge < 0) {  // every token: the running sum straight (no block sums needed)
    const double u = uniform(gen) * w.total;
    double sum = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < V; ++i)
      if (w.e[i] > 0) {
        last = i;
        if ((sum += w.e[i]) > u) return i;
      }
    return last;
  }
  thread_local std::vector<float> sums;
  sums.resize((V + kBlock - 1) / kBlock);
  kept_sums(w.e.data(), V, w.n.edge, w.n.last_tie, sums.data());
  double kept = 0;
  for (float b : sums) kept += b;
  const double u = uniform(gen) * kept;
  double sum = 0;
  int64_t last = -1;
  for (size_t b = 0; b < sums.size(); ++b) {
    if (sum + sums[b] <= u && b + 1 < sums.size()) {
      sum += sums[b];
      continue;
    }
    for (int64_t i = static_cast<int64_t>(b) * kBlock; i < std::min(V, static_cast<int64_t>(b + 1) * kBlock); ++i)
      if (w.n.keeps(i, w.e[i])) {
        last = i;
        if ((sum += w.e[i]) > u) return i;
      }
  }
  for (int64_t i = V - 1; last < 0 && i >= 0; --i)  // u within rounding of the kept mass
    if (w.n.keeps(i, w.e[i])) last = i;
  return last;
}

}  // namespace mf
