#include "moe/grouped_ffn.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>

#include "core/bf16.h"
#include "core/runtime.h"
#include "moe/combine.h"
#include "moe/fused_units.h"

namespace mf {

std::vector<std::vector<size_t>> split_units(const std::vector<int64_t>& counts, int threads) {
  std::vector<size_t> units;
  for (size_t u = 0; u < counts.size(); ++u)
    if (counts[u] > 0) units.push_back(u);
  if (threads <= 1 || static_cast<int64_t>(units.size()) < 2 * threads) return {units};
  // longest first onto the least loaded thread; each thread then runs its units in unit order
  auto by_size = units;
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return counts[a] > counts[b]; });
  std::vector<std::vector<size_t>> plan(threads);
  std::vector<int64_t> load(threads, 0);
  for (size_t u : by_size) {
    const auto t = std::min_element(load.begin(), load.end()) - load.begin();
    plan[t].push_back(u);
    load[t] += counts[u];
  }
  for (auto& p : plan) std::sort(p.begin(), p.end());
  return plan;
}

namespace {

// first pair of each unit: start[u], and start[U] = P
std::vector<int64_t> unit_starts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> start(counts.size() + 1, 0);
  for (size_t u = 0; u < counts.size(); ++u) start[u + 1] = start[u] + counts[u];
  return start;
}

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

int threads_for(const at::Tensor& t) { return t.is_cpu() ? at::get_num_threads() : 1; }

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per unit u = (expert e, block b) with rows X [n, D] (n = counts_U[u]), W1 = the block's rows
// of gate_up[e] ([2M, D]: its gate rows, then its up rows; [M, D] for gelu), W2 = the block's
// columns of down[e] ([D, M]); with one block per expert these are the whole matrices:
//   H = X W1^T (+ b1)     [n, 2M]   (G = H[:, :M], U = H[:, M:])
//   A = silu(G) * U       [n, M]    (gelu: A = gelu(H))
//   Y = A W2^T (+ b2)     [n, D]
// Backward from dY:
//   dW2 = dY^T A,  dA = dY W2,  dG = silu'(G) * U * dA,  dU = silu(G) * dA
//   dW1 = dH^T X,  dX = dH W1   with dH = [dG, dU];  db1 = sum_rows dH,  db2 = sum_rows dY
// Different blocks of one expert own disjoint slices, so every gradient slice is written once.
struct Units {
  int64_t blocks, F, M;
  bool swiglu;
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
  // writes src (laid out as w1() returns it) into the block's rows of dst_e
  void put_w1(at::Tensor dst_e, int64_t b, const at::Tensor& src) const {
    int64_t off = 0;
    for (auto [first, count] : w1_rows(b)) {
      dst_e.narrow(0, first, count).copy_(src.narrow(0, off, count));
      off += count;
    }
  }
  at::Tensor w2(const at::Tensor& down_e, int64_t b) const { return blocks == 1 ? down_e : down_e.narrow(1, b * M, M); }
  // unit u on rows x [n, D] into h [n, 2M|M], a [n, M], y [n, D]; b2 (the whole expert's) only with one block
  void forward(size_t u, const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1,
               const at::Tensor& b2, at::Tensor h, at::Tensor a, at::Tensor y) const {
    const int64_t e = static_cast<int64_t>(u) / blocks, b = static_cast<int64_t>(u) % blocks;
    project_into(h, x, w1(gate_up[e], b));
    if (b1.numel()) h.add_(w1(b1[e], b));
    if (swiglu)
      at::mul_out(a, at::silu(h.narrow(1, 0, M)), h.narrow(1, M, M));
    else
      at::gelu_out(a, h);
    project_into(y, a, w2(down[e], b));
    if (b2.numel()) y.add_(b2[e]);
  }
};

struct GroupedFFN : public torch::autograd::Function<GroupedFFN> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& gate_up,
                            const at::Tensor& down, const at::Tensor& b1, const at::Tensor& b2,
                            const std::vector<int64_t>& counts, bool swiglu, int64_t blocks) {
    const int64_t P = rows.size(0), D = rows.size(1), F = down.size(2), M = F / blocks;
    const Units units{blocks, F, M, swiglu};
    auto h = at::empty({P, swiglu ? 2 * M : M}, rows.options());
    auto a = at::empty({P, M}, rows.options());
    auto y = at::empty({P, D}, rows.options());
    const auto start = unit_starts(counts);
    each_unit(split_units(counts, threads_for(rows)), [&](size_t u, int64_t) {
      const int64_t off = start[u], n = counts[u];
      units.forward(u, rows.narrow(0, off, n), gate_up, down, b1, b2, h.narrow(0, off, n), a.narrow(0, off, n),
                    y.narrow(0, off, n));
    });
    ctx->save_for_backward({rows, gate_up, down, h, a});
    ctx->saved_data["b1"] = b1.numel() > 0;
    ctx->saved_data["b2"] = b2.numel() > 0;
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["swiglu"] = swiglu;
    ctx->saved_data["blocks"] = blocks;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &rows = saved[0], &gate_up = saved[1], &down = saved[2], &h = saved[3], &a = saved[4];
    const auto counts = ctx->saved_data["counts"].toIntVector();
    const bool swiglu = ctx->saved_data["swiglu"].toBool();
    const int64_t blocks = ctx->saved_data["blocks"].toInt(), F = down.size(2), M = F / blocks;
    const Units units{blocks, F, M, swiglu};
    auto dy = grads[0].contiguous();
    auto dx = at::empty_like(rows), dw1 = at::zeros_like(gate_up), dw2 = at::zeros_like(down);
    const bool has_b1 = ctx->saved_data["b1"].toBool(), has_b2 = ctx->saved_data["b2"].toBool();
    auto db1 = has_b1 ? at::zeros({gate_up.size(0), gate_up.size(1)}, dy.options()) : at::Tensor();
    auto db2 = has_b2 ? at::zeros({down.size(0), down.size(1)}, dy.options()) : at::Tensor();
    // units own disjoint rows of dx and disjoint slices of every weight gradient: no two write one
    const auto start = unit_starts(counts);
    each_unit(split_units(counts, threads_for(rows)), [&](size_t u, int64_t) {
      const int64_t off = start[u], n = counts[u], e = static_cast<int64_t>(u) / blocks,
                    b = static_cast<int64_t>(u) % blocks;
      auto x = rows.narrow(0, off, n), hu = h.narrow(0, off, n), au = a.narrow(0, off, n), dyu = dy.narrow(0, off, n);
      auto dxu = dx.narrow(0, off, n);
      auto dw2e = dw2[e], dw1e = dw1[e];
      if (blocks == 1)
        at::mm_out(dw2e, dyu.t(), au);
      else
        units.w2(dw2e, b).copy_(at::mm(dyu.t(), au));
      auto da = at::mm(dyu, units.w2(down[e], b));
      at::Tensor dh;
      if (swiglu) {
        auto g = hu.narrow(1, 0, M), v = hu.narrow(1, M, M);
        dh = at::cat({at::silu_backward(da * v, g), da * at::silu(g)}, 1);
      } else {
        dh = at::gelu_backward(da, hu);
      }
      if (has_b2) db2[e].copy_(dyu.sum(0));
      if (has_b1) units.put_w1(db1[e], b, dh.sum(0));
      if (blocks == 1)
        at::mm_out(dw1e, dh.t(), x);
      else
        units.put_w1(dw1e, b, at::mm(dh.t(), x));
      at::mm_out(dxu, dh, units.w1(gate_up[e], b));
    });
    return {dx, dw1, dw2, db1, db2, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::vector<int64_t> host_counts(const at::Tensor& counts_U, int64_t E, int64_t F, int64_t blocks) {
  TORCH_CHECK(blocks >= 1 && F % blocks == 0, "grouped_ffn: ", blocks, " blocks do not divide the hidden width ", F);
  TORCH_CHECK(counts_U.numel() == E * blocks, "grouped_ffn: ", counts_U.numel(), " unit counts for ", E, " experts x ",
              blocks, " blocks");
  auto host = counts_U.to(at::kCPU, at::kLong).contiguous();
  return {host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()};
}

}  // namespace

at::Tensor grouped_ffn_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                const at::Tensor& counts_U, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                                bool swiglu, const at::Tensor& gate_up_bias, const at::Tensor& down_bias,
                                int64_t blocks, int64_t chunk_hidden, UnitPack* pack) {
  TORCH_CHECK(!at::GradMode::is_enabled(), "grouped_ffn_combined is the inference path: call it without grad");
  const int64_t D = x_TD.size(1), F = down_EDF.size(2), M = F / blocks;
  const auto counts = host_counts(counts_U, down_EDF.size(0), F, blocks);
  TORCH_CHECK(blocks == 1 || !down_bias.defined(), "grouped_ffn_combined: the output bias belongs to the whole expert");
  auto x = x_TD.contiguous();
  auto token = token_P.to(at::kLong).contiguous();
  auto weight = weight_P.to(x.scalar_type()).contiguous();
  auto y_TD = at::zeros_like(x);
  const auto start = unit_starts(counts);
  const auto plan = split_units(counts, threads_for(x));
  // per thread: its output (the first thread's is y_TD; the others are added at the end)
  std::vector<at::Tensor> ys(plan.size());
  for (size_t t = 0; t < plan.size(); ++t) ys[t] = t == 0 ? y_TD : at::zeros_like(x);
  TORCH_CHECK(!pack || fused_units_available(x), "the fused units kernel needs float32 on the CPU");
  if (pack) {
    const auto packed = pack->get(gate_up, down_EDF, gate_up_bias, down_bias, blocks, swiglu);
    auto h = at::empty({static_cast<int64_t>(plan.size()), kFusedChunk, packed->n1}, x.options());
    each_unit(plan, [&](size_t u, int64_t t) {
      fused_unit(*packed, static_cast<int64_t>(u), x.data_ptr<float>(), token.data_ptr<int64_t>() + start[u],
                 weight.data_ptr<float>() + start[u], counts[u], ys[t].data_ptr<float>(), h[t].data_ptr<float>());
    });
  } else {
    const Units units_of{blocks, F, M, swiglu};
    const auto none = at::empty({0}, x_TD.options());
    const auto& b1 = gate_up_bias.defined() ? gate_up_bias : none;
    const auto& b2 = down_bias.defined() ? down_bias : none;
    const int64_t R = std::max<int64_t>(1, chunk_hidden / M);
    struct Buffers {  // per thread
      at::Tensor rows, h, a, out;
    };
    std::vector<Buffers> bufs(plan.size());
    for (auto& b : bufs)
      b = {at::empty({R, D}, x.options()), at::empty({R, swiglu ? 2 * M : M}, x.options()),
           at::empty({R, M}, x.options()), at::empty({R, D}, x.options())};
    each_unit(plan, [&](size_t u, int64_t t) {
      auto& [rows, h, a, out] = bufs[t];
      for (int64_t off = 0; off < counts[u]; off += R) {
        const int64_t n = std::min(R, counts[u] - off);
        auto token_n = token.narrow(0, start[u] + off, n);
        auto rows_n = rows.narrow(0, 0, n), out_n = out.narrow(0, 0, n);
        gather_into(rows_n, x, token_n);
        units_of.forward(u, rows_n, gate_up, down_EDF, b1, b2, h.narrow(0, 0, n), a.narrow(0, 0, n), out_n);
        combine_into(ys[t], out_n, token_n, weight.narrow(0, start[u] + off, n));
      }
    });
  }
  for (size_t t = 1; t < plan.size(); ++t) y_TD.add_(ys[t]);
  return y_TD;
}

at::Tensor grouped_ffn(const at::Tensor& rows_PD, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                       const at::Tensor& counts_U, bool swiglu, const at::Tensor& gate_up_bias,
                       const at::Tensor& down_bias, int64_t blocks) {
  const auto counts = host_counts(counts_U, down_EDF.size(0), down_EDF.size(2), blocks);
  TORCH_CHECK(blocks == 1 || !down_bias.defined(),
              "grouped_ffn: the output bias belongs to the whole expert; add it "
              "once per expert when units are blocks");
  // autograd::Function takes no undefined tensors: an empty one stands for "no bias"
  auto none = at::empty({0}, rows_PD.options());
  return GroupedFFN::apply(rows_PD.contiguous(), gate_up, down_EDF, gate_up_bias.defined() ? gate_up_bias : none,
                           down_bias.defined() ? down_bias : none, counts, swiglu, blocks);
}

}  // namespace mf
