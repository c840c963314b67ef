#include "moe/combined_ffn.h"

#include <torch/autograd.h>

#include <algorithm>

#include "core/unit_gemm.h"
#include "moe/activation_rows.h"
#include "moe/combine.h"
#include "moe/combined_tiles.h"
#include "moe/fused_units.h"
#include "moe/unit_slices.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One call's plan: the units' slices, their pair ranges, the threads' units, R rows a chunk and
// whether the products run on core/unit_gemm.h (float32, contiguous weights) or LibTorch's.
struct ChunkPlan {
  UnitSlices units;
  std::vector<int64_t> counts, start;
  std::vector<std::vector<size_t>> threads;
  int64_t R;
  bool tiles;

  ChunkPlan(const at::Tensor& x, std::vector<int64_t> counts_U, const at::Tensor& gate_up, const at::Tensor& down,
            const at::Tensor& b1, const at::Tensor& b2, bool swiglu, int64_t blocks, int64_t chunk_hidden)
      : units{blocks, down.size(2), down.size(2) / blocks, swiglu},
        counts(std::move(counts_U)),
        start(unit_starts(counts)),
        threads(split_units(counts, threads_for(x))),
        tiles(unit_gemm_preferred(x, threads.size() > 1 || threads_for(x) == 1) &&
              gate_up.scalar_type() == at::kFloat && down.scalar_type() == at::kFloat && gate_up.is_contiguous() &&
              down.is_contiguous() && b1.is_contiguous() && b2.is_contiguous() &&
              (!b1.numel() || b1.scalar_type() == at::kFloat) && (!b2.numel() || b2.scalar_type() == at::kFloat)) {
    const int64_t largest = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
    R = std::max<int64_t>(1, std::min(chunk_hidden / units.M, largest));
  }
  // per thread, unit_gemm's workspace for products as deep as D, a chunk or H
  at::Tensor workspace(const at::Tensor& x) const {
    const int64_t depth = std::max({x.size(1), R, units.hidden()});
    return at::empty({static_cast<int64_t>(threads.size()), unit_gemm_workspace(depth)}, x.options());
  }
  TileChunk chunk(size_t u, const at::Tensor& x, const at::Tensor& token, const at::Tensor& weight,
                  const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1, const at::Tensor& b2,
                  int64_t first, int64_t n, float* ws) const {
    const int64_t e = units.expert(u);
    const auto expert = [e](const at::Tensor& t) {
      return t.numel() ? t.data_ptr<float>() + e * t.stride(0) : nullptr;
    };
    return {units,
            u,
            expert(gate_up),
            expert(down),
            expert(b1),
            expert(b2),
            x.data_ptr<float>(),
            x.size(1),
            token.data_ptr<int64_t>() + first,
            weight.data_ptr<float>() + first,
            n,
            ws};
  }
  // thread t's part of a per-thread tensor (scratch(), workspace()), by pointer
  static float* rows_of(const at::Tensor& scratch, int64_t t) {
    return scratch.data_ptr<float>() + t * scratch.stride(0);
  }
  // per thread, R rows of `width` scratch
  at::Tensor scratch(int64_t width, const at::Tensor& like) const {
    return at::empty({static_cast<int64_t>(threads.size()), R, width}, like.options());
  }
  // one [T, D] sum per thread: the first is `first`, the others are added to it by sum()
  std::vector<at::Tensor> sums(const at::Tensor& first) const {
    std::vector<at::Tensor> out{first};
    for (size_t t = 1; t < threads.size(); ++t) out.push_back(at::zeros_like(first));
    return out;
  }
  static std::vector<float*> pointers(const std::vector<at::Tensor>& sums) {
    std::vector<float*> out;
    for (const auto& t : sums) out.push_back(t.data_ptr<float>());
    return out;
  }
  static void sum(std::vector<at::Tensor>& sums) {
    for (size_t t = 1; t < sums.size(); ++t) sums[0].add_(sums[t]);
  }
  // fn(u, thread, first pair, rows) for every chunk of every unit
  template <typename Fn>
  void each_chunk(Fn&& fn) const {
    each_unit(threads, [&](size_t u, int64_t t) {
      for (int64_t off = 0; off < counts[u]; off += R) fn(u, t, start[u] + off, std::min(R, counts[u] - off));
    });
  }
};

// y = sum over chunks of w * unit(x[token]); h_P keeps every pair's H (training) or is undefined
at::Tensor combined_forward(const ChunkPlan& p, const at::Tensor& x, const at::Tensor& token, const at::Tensor& weight,
                            const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1,
                            const at::Tensor& b2, const at::Tensor& h_P) {
  const int64_t D = x.size(1);
  auto y_TD = at::zeros_like(x);
  auto ys = p.sums(y_TD);
  const auto y_rows = p.tiles ? ChunkPlan::pointers(ys) : std::vector<float*>{};
  auto a = p.scratch(p.units.M, x);
  auto h = h_P.defined() ? at::Tensor() : p.scratch(p.units.hidden(), x);
  auto rows = p.tiles ? p.workspace(x) : p.scratch(D, x), out = p.tiles ? at::Tensor() : p.scratch(D, x);
  p.each_chunk([&](size_t u, int64_t t, int64_t first, int64_t n) {
    if (p.tiles) {
      float* h_n = h_P.defined() ? h_P.data_ptr<float>() + first * p.units.hidden() : ChunkPlan::rows_of(h, t);
      tiles_forward(p.chunk(u, x, token, weight, gate_up, down, b1, b2, first, n, ChunkPlan::rows_of(rows, t)), h_n,
                    ChunkPlan::rows_of(a, t), y_rows[t]);
      return;
    }
    auto h_n = h_P.defined() ? h_P.narrow(0, first, n) : h[t].narrow(0, 0, n);
    auto token_n = token.narrow(0, first, n);
    auto rows_n = rows[t].narrow(0, 0, n), out_n = out[t].narrow(0, 0, n);
    gather_into(rows_n, x, token_n);
    p.units.forward(u, rows_n, gate_up, down, b1, b2, h_n, a[t].narrow(0, 0, n), out_n);
    combine_into(ys[t], out_n, token_n, weight.narrow(0, first, n));
  });
  ChunkPlan::sum(ys);
  return y_TD;
}

// From H and G = dy[token] W2 of a chunk's pairs with weights w: dweight = rowsum(A * G),
// wa = w A and dH (into dh; on the CPU in one pass) -> dH
at::Tensor activation_chunk_backward(const UnitSlices& units, const at::Tensor& h, at::Tensor& g, const at::Tensor& w,
                                     at::Tensor& dweight, at::Tensor& wa, at::Tensor dh) {
  if (UnitSlices::rows_kernel(h, wa)) {
    activation_backward_rows(h, g, w, dweight, wa, dh, units.swiglu);
    return dh;
  }
  units.activate(h, wa);
  at::sum_out(dweight, wa * g, {1});
  g.mul_(w.unsqueeze(1));  // dA
  wa.mul_(w.unsqueeze(1));
  return units.activation_backward(h, g);
}

// The chunk backward of combined_ffn.h's header, per chunk of n pairs of unit u = (e, b).
struct CombinedFFN : public torch::autograd::Function<CombinedFFN> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& b1,
                            const at::Tensor& b2, const at::Tensor& token, const std::vector<int64_t>& counts,
                            bool swiglu, int64_t blocks, int64_t chunk_hidden) {
    const ChunkPlan p(x, counts, gate_up, down, b1, b2, swiglu, blocks, chunk_hidden);
    auto h_P = at::empty({token.numel(), p.units.hidden()}, x.options());
    auto y = combined_forward(p, x, token, weight, gate_up, down, b1, b2, h_P);
    ctx->save_for_backward({x, weight, gate_up, down, b1, b2, token, h_P});
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["swiglu"] = swiglu;
    ctx->saved_data["blocks"] = blocks;
    ctx->saved_data["chunk_hidden"] = chunk_hidden;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto &x = s[0], &weight = s[1], &gate_up = s[2], &down = s[3], &b1 = s[4], &b2 = s[5], &token = s[6],
               &h_P = s[7];
    const ChunkPlan p(x, ctx->saved_data["counts"].toIntVector(), gate_up, down, b1, b2,
                      ctx->saved_data["swiglu"].toBool(), ctx->saved_data["blocks"].toInt(),
                      ctx->saved_data["chunk_hidden"].toInt());
    const auto& units = p.units;
    auto dy = grads[0].contiguous();
    auto dx = at::zeros_like(x), dweight = at::empty_like(weight);
    auto dw1 = at::empty_like(gate_up), dw2 = at::empty_like(down);
    units.zero_unwritten(p.counts, dw1, dw2);
    auto db1 = b1.numel() ? at::zeros_like(b1) : at::Tensor(), db2 = b2.numel() ? at::zeros_like(b2) : at::Tensor();
    auto dxs = p.sums(dx);
    const auto dx_rows = p.tiles ? ChunkPlan::pointers(dxs) : std::vector<float*>{};
    const int64_t D = x.size(1);
    auto rows = p.tiles ? p.workspace(x) : p.scratch(D, x), g = p.tiles ? at::Tensor() : p.scratch(D, x);
    auto a = p.scratch(units.M, x), ga = p.scratch(units.M, x), dh = p.scratch(p.units.hidden(), x);
    p.each_chunk([&](size_t u, int64_t t, int64_t first, int64_t n) {
      const int64_t e = units.expert(u), b = units.block(u);
      if (p.tiles) {
        const TileGrads d{dweight.data_ptr<float>() + first,
                          dw1.data_ptr<float>() + e * dw1.stride(0),
                          dw2.data_ptr<float>() + e * dw2.stride(0),
                          db1,
                          db2,
                          first == p.start[u],
                          dx_rows[t]};
        tiles_backward(p.chunk(u, x, token, weight, gate_up, down, b1, b2, first, n, ChunkPlan::rows_of(rows, t)),
                       h_P.data_ptr<float>() + first * units.hidden(), dy.data_ptr<float>(), d,
                       ChunkPlan::rows_of(ga, t), ChunkPlan::rows_of(a, t), ChunkPlan::rows_of(dh, t));
        return;
      }
      auto h_n = h_P.narrow(0, first, n), a_n = a[t].narrow(0, 0, n), ga_n = ga[t].narrow(0, 0, n);
      auto token_n = token.narrow(0, first, n), w_n = weight.narrow(0, first, n);
      auto x_n = rows[t].narrow(0, 0, n), g_n = g[t].narrow(0, 0, n);
      gather_into(x_n, x, token_n);
      gather_into(g_n, dy, token_n);
      at::mm_out(ga_n, g_n, units.w2(down[e], b));  // G = dy[token] W2
      auto dweight_n = dweight.narrow(0, first, n);
      auto dh_n = activation_chunk_backward(units, h_n, ga_n, w_n, dweight_n, a_n, dh[t].narrow(0, 0, n));
      if (db2.defined()) {
        dweight_n.add_(at::mv(g_n, b2[e]));
        db2[e].addmv_(g_n.t(), w_n);
      }
      const double beta = first == p.start[u] ? 0 : 1;  // a unit's first chunk writes its slices
      auto dw2_n = units.w2(dw2[e], b);
      at::addmm_out(dw2_n, dw2_n, g_n.t(), a_n, beta);
      if (db1.defined()) units.add_w1(db1[e], b, dh_n.sum(0));
      units.add_w1_grad(dw1[e], b, dh_n, x_n, beta);
      at::mm_out(x_n, dh_n, units.w1(gate_up[e], b));  // x_n now holds dX's rows
      combine_into(dxs[t], x_n, token_n, {});
    });
    ChunkPlan::sum(dxs);
    return {dx, dweight, dw1, dw2, db1, db2, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor fused_combined(UnitPack& pack, const ChunkPlan& p, const at::Tensor& x, const at::Tensor& token,
                          const at::Tensor& weight, const at::Tensor& gate_up, const at::Tensor& down,
                          const at::Tensor& gate_up_bias, const at::Tensor& down_bias) {
  TORCH_CHECK(fused_units_available(x), "the fused units kernel needs float32 on the CPU");
  const auto packed = pack.get(gate_up, down, gate_up_bias, down_bias, p.units.blocks, p.units.swiglu);
  auto y_TD = at::zeros_like(x);
  auto ys = p.sums(y_TD);
  auto h = at::empty({static_cast<int64_t>(p.threads.size()), kFusedChunk, packed->n1}, x.options());
  each_unit(p.threads, [&](size_t u, int64_t t) {
    fused_unit(*packed, static_cast<int64_t>(u), x.data_ptr<float>(), token.data_ptr<int64_t>() + p.start[u],
               weight.data_ptr<float>() + p.start[u], p.counts[u], ys[t].data_ptr<float>(), h[t].data_ptr<float>());
  });
  ChunkPlan::sum(ys);
  return y_TD;
}

}  // namespace

at::Tensor grouped_ffn_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                const at::Tensor& counts_U, const at::Tensor& gate_up, const at::Tensor& down_EDF,
                                bool swiglu, const at::Tensor& gate_up_bias, const at::Tensor& down_bias,
                                int64_t blocks, int64_t chunk_hidden, UnitPack* pack) {
  const int64_t F = down_EDF.size(2);
  auto counts = host_counts(counts_U, down_EDF.size(0), F, blocks);
  TORCH_CHECK(blocks == 1 || !down_bias.defined(), "grouped_ffn_combined: the output bias belongs to the whole expert");
  auto x = x_TD.contiguous();
  auto token = token_P.to(at::kLong).contiguous();
  auto weight = weight_P.to(x.scalar_type()).contiguous();
  // autograd::Function takes no undefined tensors: an empty one stands for "no bias"
  const auto none = at::empty({0}, x.options());
  const auto& b1 = gate_up_bias.defined() ? gate_up_bias : none;
  const auto& b2 = down_bias.defined() ? down_bias : none;
  const bool grad =
      at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || gate_up.requires_grad() ||
                                     down_EDF.requires_grad() || b1.requires_grad() || b2.requires_grad());
  TORCH_CHECK(!pack || !grad, "the fused units kernel is an inference path: call it without grad");
  if (grad)
    return CombinedFFN::apply(x, weight, gate_up, down_EDF, b1, b2, token, counts, swiglu, blocks, chunk_hidden);
  const ChunkPlan p(x, std::move(counts), gate_up, down_EDF, b1, b2, swiglu, blocks, chunk_hidden);
  if (pack) return fused_combined(*pack, p, x, token, weight, gate_up, down_EDF, gate_up_bias, down_bias);
  return combined_forward(p, x, token, weight, gate_up, down_EDF, b1, b2, {});
}

}  // namespace mf
