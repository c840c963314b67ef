#include "train/moe_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "core/peer.h"
#include "core/timing.h"
#include "core/unit_gemm.h"
#include "moe/dispatch.h"
#include "moe/routers.h"

namespace mf {

std::vector<MoEBenchShape> moe_bench_shapes(const std::string& which) {
  std::vector<MoEBenchShape> shapes;
  if (which == "coarse" || which == "all") shapes.push_back({"coarse", 8192, 512, 8, 2, 1024});
  if (which == "fine" || which == "all") shapes.push_back({"fine", 4096, 512, 64, 8, 128});
  if (which == "finer" || which == "all") shapes.push_back({"finer", 4096, 512, 128, 8, 64});
  if (which == "scaling")
    for (int64_t E = 8; E <= 256; E *= 2)
      shapes.push_back({fmt::format("E{}", E), 4096, 512, E, E / 8, 1024 / (E / 8)});
  if (shapes.empty()) throw std::invalid_argument("bench moe --shape: coarse, fine, finer, all or scaling");
  return shapes;
}

ResultTable bench_moe(const std::vector<MoEBenchShape>& shapes, int iters, int threads, const std::string& peer) {
  ResultTable table({{"shape", "shape", "", -8},
                     {"impl", "implementation", "", -22},
                     {"tokens_per_s", "tokens/s", "{:.0f}", 10},
                     {"gflops", "GFLOP/s", "{:.1f}", 10},
                     {"vs_dense", "vs dense", "{:.2f}x", 9}});
  torch::manual_seed(0);
  for (const auto& s : shapes) {
    RouterOptions ro;
    ro.num_experts = s.E;
    ro.top_k = s.k;
    Router router(s.d, ro);
    ExpertBank bank(s.E, s.d, s.F), dense(1, s.d, s.k * s.F);
    auto x = torch::randn({s.T, s.d}).requires_grad_(true);
    auto grad = torch::ones({s.T, s.d});
    // each pass starts without gradients, as a training step does (train/optim.h's release_grads)
    auto params = router->parameters();
    for (auto* m : {static_cast<torch::nn::Module*>(&bank), static_cast<torch::nn::Module*>(&dense)})
      for (auto& p : m->parameters()) params.push_back(p);
    params.push_back(x);
    const auto release = [&] {
      for (auto& p : params) p.mutable_grad() = at::Tensor();
    };
    // one pass with the units path and the unit GEMMs pinned as asked (nullopt: the default)
    const auto moe_pass = [&](UnitsPath path, std::optional<bool> pin) -> std::function<void()> {
      return [&, path, pin] {
        force_units_path(path);
        force_unit_gemm(pin);
        release();
        auto r = router->forward(x);
        dispatch(x, r.assignment, bank).y_TD.backward(grad);
        force_units_path(std::nullopt);
        force_unit_gemm(std::nullopt);
      };
    };
    const auto dense_pass = [&](std::optional<bool> pin) -> std::function<void()> {
      return [&, pin] {
        force_unit_gemm(pin);
        release();
        dense.forward_unit(0, x).backward(grad);
        force_unit_gemm(std::nullopt);
      };
    };
    // the headline pair in rounds; the reference rows after, each best of `iters` in sequence (the
    // grouped path's [P, D] rows, 270 MB at E 256, left the heap fragmented for whatever ran next)
    const auto rounds =
        round_seconds(iters, {moe_pass(UnitsPath::Combined, std::nullopt), dense_pass(std::nullopt)}, 2, 1);
    const auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
    const double t_dense = best(rounds[1]);
    const bool tiles = unit_gemm_preferred(x);
    const double t_other = best_seconds(iters, moe_pass(UnitsPath::Combined, !tiles));  // the products not taken
    const double t_grouped = best_seconds(iters, moe_pass(UnitsPath::Grouped, std::nullopt));
    const double t_dense_blas = tiles ? best_seconds(iters, dense_pass(false)) : 0;
    const auto row = [&](const std::string& impl, double sec, double vs_dense, const std::vector<double>& each = {}) {
      nlohmann::json r = {{"shape", s.name},
                          {"impl", impl},
                          {"seconds", sec},
                          {"tokens_per_s", static_cast<double>(s.T) / sec},
                          {"gflops", s.flops() / sec / 1e9},
                          {"vs_dense", vs_dense}};
      if (!each.empty()) r["rounds_seconds"] = each;
      table.add(r);
    };
    row("moeforge MoE layer", best(rounds[0]), median_ratio(rounds[1], rounds[0]), rounds[0]);
    row(tiles ? "  LibTorch's products" : "  our unit GEMMs (pinned)", t_other, t_dense / t_other);
    row("  grouped units path", t_grouped, t_dense / t_grouped);
    row("dense SwiGLU (k*F)", t_dense, 1.0, rounds[1]);
    if (tiles) row("  dense, LibTorch's", t_dense_blas, t_dense / t_dense_blas);
    if (peer.empty()) continue;
    const auto args = fmt::format("--tokens {} --d {} --experts {} --top-k {} --hidden {} --iters {} --threads {}", s.T,
                                  s.d, s.E, s.k, s.F, iters, threads);
    for (bool default_env : {false, true}) {
      const std::string impl = default_env ? "python loop (default)" : "python loop (same env)";
      const auto res = run_peer(peer, args, default_env);
      if (res.contains("seconds"))  // another process: its best against the dense layer's best
        row(impl, res["seconds"].get<double>(), t_dense / res["seconds"].get<double>());
      else
        table.add({{"shape", s.name}, {"impl", impl}, {"note", res.value("skipped", std::string("no result"))}});
    }
  }
  return table;
}

}  // namespace mf
