#include "moe/grouped_ffn.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>

#include "core/bf16.h"
#include "moe/unit_slices.h"

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

void UnitSlices::forward(size_t u, const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down,
                         const at::Tensor& b1, const at::Tensor& b2, at::Tensor h, at::Tensor a, at::Tensor y) const {
  const int64_t e = expert(u), b = block(u);
  project_into(h, x, w1(gate_up[e], b));
  if (b1.numel()) h.add_(w1(b1[e], b));
  activate(h, a);
  project_into(y, a, w2(down[e], b));
  if (b2.numel()) y.add_(b2[e]);
}

std::vector<int64_t> host_counts(const at::Tensor& counts_U, int64_t E, int64_t F, int64_t blocks) {
  TORCH_CHECK(blocks >= 1 && F % blocks == 0, "grouped_ffn: ", blocks, " blocks do not divide the hidden width ", F);
  TORCH_CHECK(counts_U.numel() == E * blocks, "grouped_ffn: ", counts_U.numel(), " unit counts for ", E, " experts x ",
              blocks, " blocks");
  auto host = counts_U.to(at::kCPU, at::kLong).contiguous();
  return {host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// UnitSlices' FFN per unit; backward from dY:
//   dW2 = dY^T A,  dA = dY W2,  dH = act'(H, dA),  dW1 = dH^T X,  dX = dH W1
//   db1 = sum_rows dH,  db2 = sum_rows dY
// Different blocks of one expert own disjoint slices, so every gradient slice is written once.
struct GroupedFFN : public torch::autograd::Function<GroupedFFN> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& gate_up,
                            const at::Tensor& down, const at::Tensor& b1, const at::Tensor& b2,
                            const std::vector<int64_t>& counts, bool swiglu, int64_t blocks) {
    const int64_t P = rows.size(0), D = rows.size(1), F = down.size(2), M = F / blocks;
    const UnitSlices units{blocks, F, M, swiglu};
    auto h = at::empty({P, units.hidden()}, rows.options());
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
    const UnitSlices units{blocks, F, M, swiglu};
    auto dy = grads[0].contiguous();
    auto dx = at::empty_like(rows), dw1 = at::empty_like(gate_up), dw2 = at::empty_like(down);
    units.zero_unwritten(counts, dw1, dw2);
    const bool has_b1 = ctx->saved_data["b1"].toBool(), has_b2 = ctx->saved_data["b2"].toBool();
    auto db1 = has_b1 ? at::zeros({gate_up.size(0), gate_up.size(1)}, dy.options()) : at::Tensor();
    auto db2 = has_b2 ? at::zeros({down.size(0), down.size(1)}, dy.options()) : at::Tensor();
    // units own disjoint rows of dx and disjoint slices of every weight gradient: no two write one,
    // and each writes its slices once
    const auto start = unit_starts(counts);
    each_unit(split_units(counts, threads_for(rows)), [&](size_t u, int64_t) {
      const int64_t off = start[u], n = counts[u], e = units.expert(u), b = units.block(u);
      auto x = rows.narrow(0, off, n), hu = h.narrow(0, off, n), au = a.narrow(0, off, n), dyu = dy.narrow(0, off, n);
      auto dw2e = units.w2(dw2[e], b);
      at::mm_out(dw2e, dyu.t(), au);
      auto dh = units.activation_backward(hu, at::mm(dyu, units.w2(down[e], b)));
      if (has_b2) db2[e].copy_(dyu.sum(0));
      if (has_b1) units.add_w1(db1[e], b, dh.sum(0));
      units.add_w1_grad(dw1[e], b, dh, x, /*beta=*/0);
      auto dx_n = dx.narrow(0, off, n);
      at::mm_out(dx_n, dh, units.w1(gate_up[e], b));
    });
    return {dx, dw1, dw2, db1, db2, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

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
