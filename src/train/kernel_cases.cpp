#include "train/kernel_cases.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>

#include "core/bf16.h"
#include "core/tiles_linear.h"
#include "core/timing.h"
#include "core/unit_gemm.h"
#include "moe/banks.h"
#include "moe/combine.h"
#include "moe/combined_ffn.h"
#include "moe/fused_units.h"
#include "moe/grouped_ffn.h"
#include "moe/select_rows.h"
#include "moe/softmax_top_k.h"
#include "train/fused_adamw.h"
#include "train/kernel_case_parts.h"

namespace mf {
namespace {

using namespace cases;

// P pairs sorted by unit (tokens ascending within a unit) over U units and T tokens, as the
// dispatcher hands them over; counts_U per unit
struct Pairs {
  at::Tensor token_P, unit_P, counts_U;
};
Pairs sorted_pairs(int64_t T, int64_t U, int64_t P) {
  auto key_P = std::get<0>(torch::randint(U * T, {P}, torch::kLong).sort());
  Pairs p{key_P.remainder(T), key_P.div(T, "floor"), {}};
  p.counts_U = torch::bincount(p.unit_P, {}, U);
  return p;
}

KernelCase combine_case(CaseSize size, at::ScalarType dtype) {
  const int64_t T = size == CaseSize::Perf ? 4096 : 37, D = size == CaseSize::Perf ? 512 : 24, P = T * 8;
  auto out = input({P, D}, dtype, true), weight = input({P}, dtype, true), up = input({T, D}, dtype);
  auto token = torch::randint(0, T, {P}, torch::kLong);
  KernelCase c{"combine (weighted scatter-add), fwd+bwd", fmt::format("P={} T={} D={}", P, T, D), 5.0 * P * D, 1e-6};
  c.ours = [=] { return forward_backward([=] { return combine(out, token, weight, T); }, {out, weight}, up); };
  c.reference = [=] {
    return forward_backward(
        [=] {
          return torch::zeros({T, D}, out.options()).index_add(0, token, out * weight.unsqueeze(1));
        },
        {out, weight}, up);
  };
  return c;
}

KernelCase gather_case(CaseSize size, at::ScalarType dtype) {
  const int64_t T = size == CaseSize::Perf ? 4096 : 37, D = size == CaseSize::Perf ? 512 : 24, P = T * 8;
  auto x = input({T, D}, dtype, true), up = input({P, D}, dtype);
  auto token = torch::randint(0, T, {P}, torch::kLong);
  KernelCase c{"gather rows (combine's adjoint), fwd+bwd", fmt::format("P={} T={} D={}", P, T, D),
               static_cast<double>(P * D), 1e-6};
  c.ours = [=] { return forward_backward([=] { return gather_rows(x, token); }, {x}, up); };
  c.reference = [=] { return forward_backward([=] { return x.index_select(0, token); }, {x}, up); };
  return c;
}

// The router's two selections (moe/select_rows.h) at the finer MoE shape (T 4096, E 128, k 8).
// Top-k compares the selected scores in order (at::topk orders equal scores as it likes, and
// float32 rows of 128 normal scores do hold ties); the order of pairs compares indices.
KernelCase top_k_case(CaseSize size, at::ScalarType dtype) {
  const int64_t T = size == CaseSize::Perf ? 4096 : 37, E = size == CaseSize::Perf ? 128 : 24, K = 8;
  auto s = input({T, E}, dtype);
  KernelCase c{"top-k per token (router)", fmt::format("T={} E={} k={}", T, E, K), static_cast<double>(T * E), 1e-6};
  c.ours = [=] { return Outputs{s.gather(1, top_k_index(s, K))}; };
  c.reference = [=] { return Outputs{std::get<0>(s.topk(K, -1, true, true))}; };
  return c;
}

// The softmax router's outputs and their gradient against LibTorch's composition; both pick with
// top_k_index (the top-k case above compares the picks).
KernelCase softmax_top_k_case(CaseSize size, at::ScalarType dtype) {
  const int64_t T = size == CaseSize::Perf ? 4096 : 37, E = size == CaseSize::Perf ? 128 : 24, K = 8;
  auto z = input({T, E}, dtype, true), up = input({T * (E + K + 1)}, dtype);
  KernelCase c{"softmax router (probs, top-k, weights, lse), fwd+bwd", fmt::format("T={} E={} k={}", T, E, K),
               static_cast<double>(T * E), 1e-5};
  const auto flat = [](const at::Tensor& p, const at::Tensor& w, const at::Tensor& lse) {
    return at::cat({p.reshape(-1), w.reshape(-1), lse});
  };
  c.ours = [=] {
    return forward_backward(
        [=] {
          const auto r = softmax_top_k(z, K, true);
          return flat(r.probs_TE, r.weight_TK, r.lse_T);
        },
        {z}, up);
  };
  c.reference = [=] {
    return forward_backward(
        [=] {
          auto p = z.softmax(-1);
          auto w = p.gather(1, top_k_index(p.detach(), K));
          return flat(p, w / w.sum(-1, true), z.logsumexp(-1));
        },
        {z}, up);
  };
  return c;
}

KernelCase unit_order_case(CaseSize size, at::ScalarType) {
  const int64_t U = size == CaseSize::Perf ? 128 : 24, P = size == CaseSize::Perf ? 4096 * 8 : 300;
  auto unit = torch::randint(U, {P}, torch::kLong);
  KernelCase c{"pairs in unit order (stable)", fmt::format("P={} U={}", P, U), static_cast<double>(P), 1e-9};
  c.ours = [=] { return Outputs{unit_order(unit, U)}; };
  c.reference = [=] { return Outputs{std::get<1>(unit.sort(true, 0, false))}; };
  return c;
}

// SwiGLU experts unit by unit: down_e (silu(gate_e x) * up_e x) on each unit's rows
at::Tensor units_loop(const at::Tensor& rows_PD, const at::Tensor& gate_up, const at::Tensor& down, const Pairs& p) {
  const int64_t F = down.size(2);
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (int64_t e = 0; e < gate_up.size(0); ++e) {
    const int64_t n = p.counts_U[e].item<int64_t>();
    auto h = rows_PD.narrow(0, start, n).matmul(gate_up[e].t());
    outs.push_back((torch::silu(h.narrow(1, 0, F)) * h.narrow(1, F, F)).matmul(down[e].t()));
    start += n;
  }
  return torch::cat(outs);
}

// Fine-grained SwiGLU experts (64 of width 128, top-8 at the perf shape) and their sorted pairs
struct SwigluUnits {
  int64_t T, D, E, F, P;
  Pairs pairs;
  at::Tensor gate_up, down;
};
SwigluUnits swiglu_units(CaseSize size, at::ScalarType dtype) {
  const bool perf = size == CaseSize::Perf;
  const int64_t T = perf ? 4096 : 29, D = perf ? 512 : 16, E = perf ? 64 : 6, k = perf ? 8 : 2, F = perf ? 128 : 12;
  return {
      T, D, E, F, T * k, sorted_pairs(T, E, T * k), input({E, 2 * F, D}, dtype, true), input({E, D, F}, dtype, true)};
}

KernelCase grouped_case(CaseSize size, at::ScalarType dtype) {
  const auto u = swiglu_units(size, dtype);
  auto rows = input({u.P, u.D}, dtype, true), up = input({u.P, u.D}, dtype);
  KernelCase c{"grouped units (training), fwd+bwd", fmt::format("P={} D={} E={} F={} SwiGLU", u.P, u.D, u.E, u.F),
               18.0 * u.P * u.D * u.F, 1e-5};
  c.ours = [=] {
    return forward_backward([=] { return grouped_ffn(rows, u.gate_up, u.down, u.pairs.counts_U, true); },
                            {rows, u.gate_up, u.down}, up);
  };
  c.reference = [=] {
    return forward_backward([=] { return units_loop(rows, u.gate_up, u.down, u.pairs); }, {rows, u.gate_up, u.down},
                            up);
  };
  return c;
}

// The training path straight from x (fine-grained SwiGLU experts): chunks of gather -> unit ->
// combine and their hand-written backward, against gather -> the units loop -> scaled index_add.
// Its products run on core/unit_gemm.h where that is preferred (AVX-512, float32); `tiles` pins
// them there at every level (float32 only).
KernelCase combined_training_case(CaseSize size, at::ScalarType dtype, bool tiles) {
  const auto u = swiglu_units(size, dtype);
  const auto& token = u.pairs.token_P;
  auto x = input({u.T, u.D}, dtype, true), weight = input({u.P}, dtype, true), up = input({u.T, u.D}, dtype);
  KernelCase c{tiles ? "combined units (training), unit GEMMs pinned" : "combined units (training), fwd+bwd",
               fmt::format("T={} P={} D={} E={} F={} SwiGLU", u.T, u.P, u.D, u.E, u.F), 18.0 * u.P * u.D * u.F, 1e-5};
  if (tiles && dtype != at::kFloat) {
    c.runs = false;
    c.why = "float32 only";
  }
  c.ours = [=] {
    if (tiles) force_unit_gemm(true);
    auto out = forward_backward(
        [=] { return grouped_ffn_combined(x, token, weight, u.pairs.counts_U, u.gate_up, u.down, true); },
        {x, weight, u.gate_up, u.down}, up);
    if (tiles) force_unit_gemm(std::nullopt);
    return out;
  };
  c.reference = [=] {
    return forward_backward(
        [=] {
          auto out = units_loop(x.index_select(0, token), u.gate_up, u.down, u.pairs);
          return torch::zeros_like(x).index_add(0, token, out * weight.unsqueeze(1));
        },
        {x, weight, u.gate_up, u.down}, up);
  };
  return c;
}

// Inference over whole experts (top-2) or UniF-MoE's blocks (B = 8, ~13 units per token), GELU
// with biases as `bench unif`: the chunked path, or the fused kernel, against gather -> units -> combine.
KernelCase units_case(CaseSize size, at::ScalarType dtype, int64_t blocks, bool fused) {
  const bool perf = size == CaseSize::Perf;
  const int64_t T = perf ? 4096 : 53, D = perf ? 384 : 20, F = perf ? 1536 : 24, E = 7, U = E * blocks;
  const int64_t P = T * (blocks == 1 ? 2 : 13);
  auto bank = std::make_shared<ExpertBank>(E, D, F, Activation::GELU, /*bias=*/true);
  {
    torch::NoGradGuard g;
    for (auto& w : bank->parameters()) w.copy_(input(w.sizes(), torch::kFloat64));
  }
  bank->to(dtype);
  const auto pairs = sorted_pairs(T, U, P);
  auto x = input({T, D}, dtype), weight = torch::rand({P}, torch::kFloat64).to(dtype);
  const auto out_bias = blocks == 1 ? bank->down_proj_bias : at::Tensor();
  KernelCase c{
      fmt::format("{} units, inference ({})", fused ? "fused" : "combined", blocks == 1 ? "whole experts" : "blocks"),
      fmt::format("T={} D={} F={} E={} B={} P={} GELU", T, D, F, E, blocks, P), 4.0 * P * D * F / blocks, 1e-5};
  if (fused && !fused_units_available(x)) {
    c.runs = false;
    c.why = "float32 only";
  }
  c.ours = [=] {
    torch::NoGradGuard g;
    return Outputs{grouped_ffn_combined(x, pairs.token_P, weight, pairs.counts_U, bank->gate_up_proj, bank->down_proj,
                                        false, bank->gate_up_proj_bias, out_bias, blocks, kCombinedChunkHidden,
                                        fused ? bank->unit_pack() : nullptr)};
  };
  c.reference = [=] {
    torch::NoGradGuard g;
    ExpertBlocks units(*bank, blocks);
    auto rows = x.index_select(0, pairs.token_P);
    auto out = blocks == 1 ? bank->forward_grouped(rows, pairs.counts_U) : units.forward_grouped(rows, pairs.counts_U);
    return Outputs{torch::zeros_like(x).index_add(0, pairs.token_P, out * weight.unsqueeze(1))};
  };
  return c;
}

KernelCase adamw_case(CaseSize size, at::ScalarType dtype) {
  // perf: the quickstart model's tensors (embedding, head, per layer experts and attention)
  std::vector<std::vector<int64_t>> shapes = {{37, 5}, {300000}};
  if (size == CaseSize::Perf) {
    shapes = {{8192, 256}, {8192, 256}};
    for (int l = 0; l < 4; ++l)
      for (std::vector<int64_t> s : {std::vector<int64_t>{8, 704, 256}, {8, 256, 352}, {256, 256}, {128, 256}})
        shapes.push_back(s);
  }
  int64_t n = 0;
  for (auto& s : shapes) n += c10::multiply_integers(s);
  std::vector<at::Tensor> start, grads;
  for (auto& s : shapes) start.push_back(input(s, dtype)), grads.push_back(input(s, dtype));
  const auto opts = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  // three steps from the same start: a fresh optimizer per call, so every call does the same work
  auto steps = [=](bool fused) {
    std::vector<at::Tensor> params;
    for (auto& t : start) {
      params.push_back(t.clone().requires_grad_(true));
      params.back().mutable_grad() = grads[params.size() - 1];
    }
    std::unique_ptr<torch::optim::AdamW> opt =
        fused ? std::make_unique<FusedAdamW>(params, opts) : std::make_unique<torch::optim::AdamW>(params, opts);
    for (int i = 0; i < 3; ++i) opt->step();
    Outputs out;
    for (auto& p : params) out.push_back(p.detach());
    return out;
  };
  KernelCase c{"AdamW, 3 steps", fmt::format("{:.2f} M parameters in {} tensors", n / 1e6, shapes.size()), 3.0 * 14 * n,
               1e-6};
  c.ours = [=] { return steps(true); };
  c.reference = [=] { return steps(false); };
  return c;
}

}  // namespace

// y = x W^T with W held in bf16 or int8 blocks (core/bf16.h, core/q8.h) against LibTorch's linear
// on the float32 copy of the same rounded weights: decode rows (the row kernel) and more rows than
// it takes (widened panels into the GEMM). In the float64 table ours widens W to float64: the
// float32 table tests the kernel.
KernelCase held_case(CaseSize size, at::ScalarType dtype, at::ScalarType held, int64_t M) {
  const bool perf = size == CaseSize::Perf;
  const int64_t K = perf ? 2048 : held == at::kChar ? 96 : 37, N = perf ? 6144 : 21;  // int8: rows of whole blocks
  auto x = input({M, K}, dtype);
  auto w = input({N, K}, at::kFloat);
  if (held == at::kChar) {
    auto q = q8_empty(w.sizes(), w.options());
    copy_weights(q, w);
    w = q;
  } else {
    w = w.to(held);
  }
  KernelCase c{fmt::format("linear, {} weights ({}{})", held == at::kChar ? "int8" : "bf16",
                           M <= kBf16KernelRows ? "row kernel" : "panels",
                           M == 1   ? ", one row"
                           : M == 2 ? ", two rows"
                                    : ""),
               fmt::format("M={} K={} N={}", M, K, N), 2.0 * M * K * N, 1e-5};
  c.ours = [=] { return Outputs{project(x, w)}; };
  c.reference = [=, w32 = widened(w, at::kFloat).to(dtype)] { return Outputs{at::linear(x, w32)}; };
  return c;
}

// y = x W^T + b on our unit GEMMs (core/tiles_linear.h: the model's float32 projections and the
// router's scores; pinned at every level), forward and backward, against LibTorch's linear.
KernelCase linear_case(CaseSize size, at::ScalarType dtype) {
  const bool perf = size == CaseSize::Perf;
  const int64_t M = perf ? 4096 : 70, K = perf ? 512 : 37, N = perf ? 1536 : 21;
  auto x = input({M, K}, dtype, true), w = input({N, K}, dtype, true), b = input({N}, dtype, true);
  auto up = input({M, N}, dtype);
  KernelCase c{"linear, float32 (unit GEMMs), fwd+bwd", fmt::format("M={} K={} N={} bias", M, K, N), 6.0 * M * K * N,
               1e-5};
  if (dtype != at::kFloat) {
    c.runs = false;
    c.why = "float32 only";
  }
  c.ours = [=] {
    force_unit_gemm(true);
    auto out = forward_backward([=] { return tiles_linear(x, w, b); }, {x, w, b}, up);
    force_unit_gemm(std::nullopt);
    return out;
  };
  c.reference = [=] { return forward_backward([=] { return at::linear(x, w, b); }, {x, w, b}, up); };
  return c;
}

std::vector<KernelCase> kernel_cases(CaseSize size, at::ScalarType dtype) {
  torch::manual_seed(0);
  std::vector<KernelCase> out{combine_case(size, dtype),
                              gather_case(size, dtype),
                              top_k_case(size, dtype),
                              softmax_top_k_case(size, dtype),
                              unit_order_case(size, dtype),
                              grouped_case(size, dtype),
                              combined_training_case(size, dtype, false),
                              combined_training_case(size, dtype, true),
                              units_case(size, dtype, 1, false),
                              units_case(size, dtype, 8, false),
                              units_case(size, dtype, 1, true),
                              units_case(size, dtype, 8, true),
                              adamw_case(size, dtype),
                              linear_case(size, dtype),
                              held_case(size, dtype, at::kBFloat16, 1),
                              held_case(size, dtype, at::kBFloat16, 2),
                              held_case(size, dtype, at::kBFloat16, size == CaseSize::Perf ? 64 : 7),
                              held_case(size, dtype, at::kBFloat16, size == CaseSize::Perf ? 256 : 131),
                              held_case(size, dtype, at::kChar, 1),
                              held_case(size, dtype, at::kChar, 2),
                              held_case(size, dtype, at::kChar, size == CaseSize::Perf ? 64 : 7),
                              held_case(size, dtype, at::kChar, size == CaseSize::Perf ? 256 : 131)};
  for (auto& c : model_kernel_cases(size, dtype)) out.push_back(std::move(c));
  return out;
}

double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  TORCH_CHECK(a.size() == b.size(), "relative_error: ", a.size(), " outputs against ", b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto ref = b[i].to(at::kDouble);
    const double diff = (a[i].to(at::kDouble) - ref).abs().max().item<double>();
    const double scale = ref.abs().max().item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

ResultTable bench_kernels(int iters) {
  ResultTable table({{"kernel", "kernel", "", -42},
                     {"shape", "shape", "", -42},
                     {"ours_ms", "ours ms", "{:.2f}", 9},
                     {"libtorch_ms", "LibTorch ms", "{:.2f}", 12},
                     {"speed_up", "speed-up", "{:.2f}x", 8},
                     {"gflops", "GFLOP/s", "{:.1f}", 8},
                     {"relative_error", "rel. err", "{:.1e}", 9}});
  for (auto& c : kernel_cases(CaseSize::Perf, at::kFloat)) {
    if (!c.runs) {
      table.add({{"kernel", c.kernel}, {"shape", c.shape}, {"flops", c.flops}, {"note", "not run: " + c.why}});
      continue;
    }
    const double error = relative_error(c.ours(), c.reference());
    const double ours = best_seconds(iters, c.ours), theirs = best_seconds(iters, c.reference);
    table.add({{"kernel", c.kernel},
               {"shape", c.shape},
               {"flops", c.flops},
               {"ours_s", ours},
               {"libtorch_s", theirs},
               {"ours_ms", 1e3 * ours},
               {"libtorch_ms", 1e3 * theirs},
               {"speed_up", theirs / ours},
               {"gflops", c.flops / ours / 1e9},
               {"relative_error", error}});
  }
  return table;
}

}  // namespace mf
