// The decode engine's parts (serve/decode_engine.cpp): a weight matrix as the row kernel reads it,
// the threads of a step and their barrier, the products, norms and activations of a step, a
// router's choice for one token, and attention's softmax over a row's scores.
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "core/q8.h"
#include "moe/routers.h"

namespace mf::decoding {

// w [N, K] (rows ld apart): float32, bf16 bit patterns or int8 blocks, with an optional bias [N]
struct Matrix {
  const void* data = nullptr;
  at::ScalarType dtype = at::kFloat;
  Q8Rows q8;
  int64_t N = 0, K = 0, ld = 0;
  const float* bias = nullptr;
};

const float* floats(const at::Tensor& t);  // nullptr for an undefined t
bool held_weight(at::ScalarType t);        // float32, or held narrow (core/bf16.h)
Matrix matrix(const at::Tensor& w, const at::Tensor& b = {});

// The threads of one step: each runs the whole step, takes its share of every product and meets
// the others at a spinning barrier (OpenMP's barrier, and a parallel region per product, sleep and
// wake through the kernel under OMP_WAIT_POLICY=PASSIVE: ~50 us each, a third of a token's time).
class SpinBarrier {
 public:
  void wait(int threads) {
    const int gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == gen; ++spins)
      if (spins > 2000) std::this_thread::yield();  // a loaded machine: let the late thread run
  }

 private:
  std::atomic<int> arrived_{0}, generation_{0};
};

struct Team {
  int id = 0, size = 1;
  SpinBarrier* barrier = nullptr;
  bool lead() const { return id == 0; }
  void sync() const {
    if (size > 1) barrier->wait(size);
  }
  // this thread's share [first, second) of n items, in multiples of `align`
  std::pair<int64_t, int64_t> share(int64_t n, int64_t align = 1) const {
    const int64_t blocks = (n + align - 1) / align;
    return {std::min(n, blocks * id / size * align), std::min(n, blocks * (id + 1) / size * align)};
  }
  // this thread's columns of a product with n outputs (times() takes these), and of the
  // elementwise work on them, which it then finds in its own cache
  std::pair<int64_t, int64_t> columns(int64_t n) const { return share(n, 4); }
};

// outputs [n0, n1) of y[m] = w x[m] (+ b) for the M rows of x [M, K] into y [M, N]
void times(const Matrix& w, const float* x, int64_t M, float* y, int64_t n0, int64_t n1);
// the same for this thread's columns
void times(const Team& team, const Matrix& w, const float* x, int64_t M, float* y);
// out = x / sqrt(mean(x^2) + eps) * weight over n numbers (RMSNormImpl)
void rms_norm(const float* x, int64_t n, const float* weight, double eps, float* out);

// An expert, a shared expert or a dense FFN: down(act(gate x) * up x) for SwiGLU (up.N > 0),
// down(gelu(gate x)) for GELU, each product with its bias where it has one.
struct Unit {
  Matrix gate, up, down;
};

// act(g) [* u] in place of g (SwiGLU when `u`, else exact GELU) in columns [c0, c1) of `rows` rows
// `ld` apart
void activate(float* g, const float* u, int64_t rows, int64_t ld, int64_t c0, int64_t c1);

// RouterImpl's top-k scoring, selection and weights for one token
struct Router {
  Matrix w;
  RouterKind kind = RouterKind::SoftmaxTopK;
  int64_t top_k = 1;
  bool renormalize = true;
  const float* selection_bias = nullptr;  // only when the balancing bias is on
  float norm_factor = 1;                  // norm_topk: sigma * c
  double norm_eps = 0;
  float scale = 1;  // gate_scale

  // logits [E] -> (unit, weight) pairs, best first; `score` and `order` are scratch of E numbers
  void pick(const float* logits, std::vector<float>& score, std::vector<int64_t>& order,
            std::vector<std::pair<int64_t, float>>& out) const;
};

// A step's routed pairs grouped by unit, as each thread builds them from every row's picks (a copy
// of its own: it then reads the gathered rows from its own cache, and waits for no other thread),
// and that thread's scratch for Router::pick.
struct Routed {
  std::vector<int64_t> row, offsets;  // pairs of unit e: offsets[e] <= p < offsets[e + 1]
  std::vector<float> weight, in;      // in [P, D]: the pairs' rows of h
  std::vector<float> score;
  std::vector<int64_t> order;

  // picks[m]: row m's (unit, weight) pairs, m < M; E units; h [M, D]
  void group(const std::vector<std::vector<std::pair<int64_t, float>>>& picks, int64_t M, int64_t E, const float* h,
             int64_t D);
  int64_t first(int64_t e) const { return offsets[e]; }
  int64_t rows(int64_t e) const { return offsets[e + 1] - offsets[e]; }
  int64_t pairs() const { return static_cast<int64_t>(row.size()); }
};

// out [Dh] = softmax(scale p_j) . value_j over the S cached positions j (rows `stride` apart), p
// the dot products q . key_j (overwritten)
void softmax_values(float* p, const float* value, int64_t S, int64_t Dh, int64_t stride, float scale, float* out);

}  // namespace mf::decoding
