// What moe/grouped_ffn.cpp (rows already gathered) and moe/combined_ffn.cpp (pairs straight from
// x) share: a unit's slices of the stacked expert weights, its FFN and activation gradient, and
// the loop that runs units on threads. Internal to moe/; a file calling each_unit must be one of
// CMakeLists' MOEFORGE_KERNEL_SOURCES (at::parallel_for runs on one thread without -fopenmp).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <utility>
#include <vector>

#include "core/runtime.h"
#include "moe/activation_rows.h"

namespace mf {

// The non-empty units of counts split among `threads` threads, or all in one list when there are
// fewer than two per thread.
std::vector<std::vector<size_t>> split_units(const std::vector<int64_t>& counts, int threads);

// counts_U on the host, checked against E experts x `blocks` blocks of F / blocks channels
std::vector<int64_t> host_counts(const at::Tensor& counts_U, int64_t E, int64_t F, int64_t blocks);

// first pair of each unit: start[u], and start[U] = P
inline std::vector<int64_t> unit_starts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> start(counts.size() + 1, 0);
  for (size_t u = 0; u < counts.size(); ++u) start[u + 1] = start[u] + counts[u];
  return start;
}

inline int threads_for(const at::Tensor& t) { return t.is_cpu() ? at::get_num_threads() : 1; }

// fn(u, thread) for the units of plan (split_units), thread t running plan[t] in order. With
// several threads, whole units per thread and one-thread GEMMs: threads meeting inside every
// small GEMM spent a fifth of UniF-MoE's time in OpenBLAS's yields between its 112 block GEMMs.
template <typename Fn>
void each_unit(const std::vector<std::vector<size_t>>& plan, Fn&& fn) {
  if (plan.size() == 1) {
    for (size_t u : plan[0]) fn(u, 0);
    return;
  }
  ScopedBlasThreads one(1);
  const bool grad = at::GradMode::is_enabled();
  at::parallel_for(0, static_cast<int64_t>(plan.size()), 1, [&](int64_t t0, int64_t t1) {
    c10::AutoGradMode mode(grad);  // thread-local: the pool's threads do not inherit it
    for (int64_t t = t0; t < t1; ++t)
      for (size_t u : plan[t]) fn(u, t);
  });
}

// Per unit u = (expert e, block b) with rows X [n, D] (n = counts_U[u]), W1 = the block's rows
// of gate_up[e] ([2M, D]: its gate rows, then its up rows; [M, D] for gelu), W2 = the block's
// columns of down[e] ([D, M]); with one block per expert these are the whole matrices:
//   H = X W1^T (+ b1)     [n, 2M]   (G = H[:, :M], U = H[:, M:])
//   A = silu(G) * U       [n, M]    (gelu: A = gelu(H))
//   Y = A W2^T (+ b2)     [n, D]
// and from dA the activation's gradient dH = [silu'(G) * U * dA, silu(G) * dA] (gelu: gelu'(H) * dA).
struct UnitSlices {
  int64_t blocks, F, M;
  bool swiglu;
  int64_t hidden() const { return swiglu ? 2 * M : M; }  // H's columns
  int64_t expert(size_t u) const { return static_cast<int64_t>(u) / blocks; }
  int64_t block(size_t u) const { return static_cast<int64_t>(u) % blocks; }
  // rows of gate_up[e] (and of its bias) that block b uses, as (first row, count), in H's column order
  std::vector<std::pair<int64_t, int64_t>> w1_rows(int64_t b) const {
    if (blocks == 1) return {{0, swiglu ? 2 * F : F}};
    if (swiglu) return {{b * M, M}, {F + b * M, M}};
    return {{b * M, M}};
  }
  at::Tensor w1(const at::Tensor& gate_up_e, int64_t b) const {  // [2M|M, D] (or [2M|M] for a bias)
    auto rows = w1_rows(b);
    if (rows.size() == 1) return gate_up_e.narrow(0, rows[0].first, rows[0].second);
    return at::cat({gate_up_e.narrow(0, rows[0].first, M), gate_up_e.narrow(0, rows[1].first, M)});
  }
  // dst_e's block rows += src (laid out as w1() returns it)
  void add_w1(at::Tensor dst_e, int64_t b, const at::Tensor& src) const {
    int64_t off = 0;
    for (auto [first, count] : w1_rows(b)) {
      dst_e.narrow(0, first, count).add_(src.narrow(0, off, count));
      off += count;
    }
  }
  // dst_e's block rows = beta dst + dH^T X without a [2M, D] temporary (beta 0: dst is not read)
  void add_w1_grad(at::Tensor dst_e, int64_t b, const at::Tensor& dh, const at::Tensor& x, double beta) const {
    int64_t off = 0;
    for (auto [first, count] : w1_rows(b)) {
      auto dst = dst_e.narrow(0, first, count);
      at::addmm_out(dst, dst, dh.narrow(1, off, count).t(), x, beta);
      off += count;
    }
  }
  // Weight gradients start empty and each unit's first GEMM writes its slices (beta 0): the slices
  // of units without pairs, which no GEMM writes, are zeroed here.
  void zero_unwritten(const std::vector<int64_t>& counts, at::Tensor& dw1, at::Tensor& dw2) const {
    for (size_t u = 0; u < counts.size(); ++u) {
      if (counts[u] > 0) continue;
      for (auto [first, count] : w1_rows(block(u))) dw1[expert(u)].narrow(0, first, count).zero_();
      w2(dw2[expert(u)], block(u)).zero_();
    }
  }
  at::Tensor w2(const at::Tensor& down_e, int64_t b) const { return blocks == 1 ? down_e : down_e.narrow(1, b * M, M); }
  // A from H into a
  // whether moe/activation_rows.h takes these rows (else LibTorch's ops)
  static bool rows_kernel(const at::Tensor& h, const at::Tensor& a) {
    return h.is_cpu() && h.is_contiguous() && a.is_contiguous() &&
           (h.scalar_type() == at::kFloat || h.scalar_type() == at::kDouble);
  }
  void activate(const at::Tensor& h, at::Tensor a) const {
    if (rows_kernel(h, a))
      activation_forward_rows(h, a, swiglu);
    else if (swiglu)
      at::mul_out(a, at::silu(h.narrow(1, 0, M)), h.narrow(1, M, M));
    else
      at::gelu_out(a, h);
  }
  at::Tensor activation_backward(const at::Tensor& h, const at::Tensor& da) const {  // dH
    if (!swiglu) return at::gelu_backward(da, h);
    auto g = h.narrow(1, 0, M), v = h.narrow(1, M, M);
    return at::cat({at::silu_backward(da * v, g), da * at::silu(g)}, 1);
  }
  // unit u on rows x [n, D] into h [n, 2M|M], a [n, M], y [n, D]; b1, b2 empty for none (b2, the
  // whole expert's, only with one block)
  void forward(size_t u, const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1,
               const at::Tensor& b2, at::Tensor h, at::Tensor a, at::Tensor y) const;
};

}  // namespace mf
