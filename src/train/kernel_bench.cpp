#include "train/kernel_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "core/timing.h"
#include "model/small_attention.h"
#include "moe/banks.h"
#include "moe/combine.h"
#include "moe/fused_units.h"
#include "moe/grouped_ffn.h"
#include "train/fused_adamw.h"

namespace mf {
namespace {

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

// forward + backward of f over `inputs` (leaves); returns the output and the inputs' gradients
std::vector<at::Tensor> forward_backward(const std::function<at::Tensor()>& f, std::vector<at::Tensor> inputs,
                                         const at::Tensor& up) {
  for (auto& x : inputs) x.mutable_grad() = at::Tensor();
  auto y = f();
  y.backward(up);
  std::vector<at::Tensor> out{y.detach()};
  for (auto& x : inputs) out.push_back(x.grad());
  return out;
}

KernelBenchRow compare(const std::string& kernel, const std::string& shape, int iters,
                       const std::function<std::vector<at::Tensor>()>& ours,
                       const std::function<std::vector<at::Tensor>()>& libtorch) {
  KernelBenchRow r{kernel, shape};
  r.max_abs_diff = max_diff(ours(), libtorch());
  r.ours_s = best_seconds(iters, ours);
  r.libtorch_s = best_seconds(iters, libtorch);
  return r;
}

KernelBenchRow combine_row(int iters) {
  const int64_t T = 4096, P = T * 8, D = 512;  // the fine-grained MoE shape: top-8
  auto out = torch::randn({P, D}).requires_grad_(true);
  auto weight = torch::rand({P}).requires_grad_(true);
  auto token = torch::randint(0, T, {P}, torch::kLong);
  auto up = torch::randn({T, D});
  auto run = [&](const std::function<at::Tensor()>& f) { return forward_backward(f, {out, weight}, up); };
  return compare(
      "combine (weighted scatter-add), fwd+bwd", fmt::format("P={} T={} D={}", P, T, D), iters,
      [&] { return run([&] { return combine(out, token, weight, T); }); },
      [&] { return run([&] {
              return torch::zeros({T, D}).index_add(0, token, out * weight.unsqueeze(1));
            }); });
}

KernelBenchRow attention_row(int iters) {
  const int64_t B = 128, H = 4, N = 17, Dh = 24;  // the Fashion-MNIST ViT, from its qkv projection's output
  auto qkv = torch::randn({B, N, 3, H, Dh}).requires_grad_(true);
  auto up = torch::randn({B, N, H, Dh});
  auto run = [&](const std::function<at::Tensor()>& f) { return forward_backward(f, {qkv}, up); };
  return compare(
      "small attention, fwd+bwd", fmt::format("B={} H={} N={} Dh={}", B, H, N, Dh), iters,
      [&] { return run([&] { return small_attention_packed(qkv, false); }); },
      [&] {
        return run([&] {
          auto heads = qkv.permute({2, 0, 3, 1, 4});
          auto s = torch::matmul(heads[0], heads[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
          return torch::matmul(torch::softmax(s, -1), heads[2]).transpose(1, 2);
        });
      });
}

KernelBenchRow adamw_row(int iters) {
  // the quickstart model's tensors: embedding and head, then per layer the experts and attention
  std::vector<std::vector<int64_t>> shapes = {{8192, 256}, {8192, 256}};
  for (int l = 0; l < 4; ++l)
    for (std::vector<int64_t> s : {std::vector<int64_t>{8, 704, 256}, {8, 256, 352}, {256, 256}, {128, 256}})
      shapes.push_back(s);
  int64_t n = 0;
  for (auto& s : shapes) n += c10::multiply_integers(s);
  auto state = [&](auto make) {
    torch::manual_seed(0);
    std::vector<at::Tensor> params;
    for (auto& s : shapes) {
      params.push_back(torch::randn(s).requires_grad_(true));
      params.back().mutable_grad() = torch::randn(s);
    }
    return std::make_pair(params, make(params));
  };
  auto opts = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  auto [p1, fused] = state([&](auto& p) { return std::make_unique<FusedAdamW>(p, opts); });
  auto [p2, plain] = state([&](auto& p) { return std::make_unique<torch::optim::AdamW>(p, opts); });
  auto snapshot = [](const std::vector<at::Tensor>& p) {
    std::vector<at::Tensor> s;
    for (auto& x : p) s.push_back(x.detach());
    return s;
  };
  return compare(
      "AdamW step", fmt::format("{:.1f} M parameters in {} tensors", n / 1e6, shapes.size()), iters,
      [&] {
        fused->step();
        return snapshot(p1);
      },
      [&] {
        plain->step();
        return snapshot(p2);
      });
}

// The inference path of expert units against the gather -> GEMM -> combine path it replaces, at
// `bench unif`'s shape: UniF-MoE's (expert, block) units (B = 8, 12.65 of them per token) and
// top-2 over whole experts.
KernelBenchRow units_row(int iters, int64_t blocks, int64_t per_token) {
  const int64_t T = 4096, D = 384, F = 1536, E = 7, U = E * blocks, P = T * per_token;
  ExpertBank bank(E, D, F, Activation::GELU, /*bias=*/true);
  auto x = torch::randn({T, D});
  // pairs sorted by unit, tokens ascending inside a unit, as the dispatcher hands them over
  auto key_P = std::get<0>(torch::randint(U * T, {P}, torch::kLong).sort());
  auto unit_P = key_P.div(T, "floor"), token_P = key_P.remainder(T);
  auto weight_P = torch::rand({P});
  auto counts = torch::bincount(unit_P, {}, U);
  torch::NoGradGuard no_grad;
  auto run = [&](UnitPack* pack) {
    return std::vector<at::Tensor>{grouped_ffn_combined(
        x, token_P, weight_P, counts, bank.gate_up_proj, bank.down_proj, false, bank.gate_up_proj_bias,
        blocks == 1 ? bank.down_proj_bias : at::Tensor(), blocks, kCombinedChunkHidden, pack)};
  };
  return compare(
      fmt::format("expert units, inference ({})", blocks == 1 ? "whole experts" : "blocks"),
      fmt::format("T={} D={} F={} E={} B={} P={}{}", T, D, F, E, blocks, P,
                  fused_units_available(x) ? "" : " (no AVX-512: both take the gather path)"),
      iters, [&] { return run(bank.unit_pack()); }, [&] { return run(nullptr); });
}

}  // namespace

std::vector<KernelBenchRow> bench_kernels(int iters) {
  torch::manual_seed(0);
  return {combine_row(iters), attention_row(iters), adamw_row(iters), units_row(iters, 8, 13), units_row(iters, 1, 2)};
}

}  // namespace mf
