// core/tiles_linear.h against float64 at::linear: y, dx and dW, pinned on unit_gemm (ctest runs
// this at every SIMD level, tests/CMakeLists.txt), and unpinned where it falls back.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/tiles_linear.h"
#include "core/unit_gemm.h"

using namespace mf;

namespace {

struct Pin {  // unit_gemm pinned on or off for a test, unpinned after
  explicit Pin(bool on) { force_unit_gemm(on); }
  ~Pin() { force_unit_gemm(std::nullopt); }
};

// max |ours - reference| over max |reference| for y, dx, dW, db (the loss sum(y * c) for a fixed
// c; x [2, T / 2, D] when T is even, to take the leading dimensions as rows)
std::vector<double> errors(int64_t T, int64_t D, int64_t E, int threads) {
  at::set_num_threads(threads);
  const auto shape = T % 2 ? std::vector<int64_t>{T, D} : std::vector<int64_t>{2, T / 2, D};
  auto x = torch::randn(shape).requires_grad_(true), w = torch::randn({E, D}).requires_grad_(true);
  auto b = torch::randn({E}).requires_grad_(true);
  auto y = tiles_linear(x, w, b);
  auto c = torch::randn(y.sizes());
  (y * c).sum().backward();
  const auto f64 = [](const at::Tensor& t) { return t.detach().to(torch::kFloat64).requires_grad_(true); };
  auto x64 = f64(x), w64 = f64(w), b64 = f64(b);
  auto y64 = at::linear(x64, w64, b64);
  (y64 * c.to(torch::kFloat64)).sum().backward();
  std::vector<double> out;
  for (auto [got, ref] : {std::pair{y, y64}, {x.grad(), x64.grad()}, {w.grad(), w64.grad()}, {b.grad(), b64.grad()}})
    out.push_back(ref.numel() ? (got.to(torch::kFloat64) - ref).abs().max().item<double>() /
                                    std::max(ref.abs().max().item<double>(), 1e-30)
                              : 0.0);
  at::set_num_threads(1);
  return out;
}

}  // namespace

// Shapes with rows, columns and depths that are not whole tiles, more tokens than one of dW's
// 512-token pieces (1100: pieces of 512, 512, 76 added up), fewer outputs than a tile's rows,
// the fewest rows taken (32); 1 and 2 threads. Float32 against float64: a sum of up to 1100 products rounds to about
// 1e-6 of its size; a wrong row, piece or tail is off by the entry's own size.
TEST(TilesLinear, MatchesFloat64LinearWithGradients) {
  Pin pin(true);
  torch::manual_seed(31);
  for (int threads : {1, 2})
    for (auto [T, D, E] :
         {std::tuple{1100, 37, 13}, std::tuple{64, 512, 128}, std::tuple{33, 9, 3}, std::tuple{32, 8, 20}}) {
      const auto e = errors(T, D, E, threads);
      for (size_t i = 0; i < e.size(); ++i)
        EXPECT_LT(e[i], 1e-5) << fmt::format("T {} D {} E {} threads {}: {} off by {}", T, D, E, threads,
                                             std::vector<std::string>{"y", "dx", "dW", "db"}[i], e[i]);
    }
}

// unpinned off, float64, fewer than 32 rows: at::linear itself
TEST(TilesLinear, FallsBackToLinear) {
  torch::manual_seed(32);
  auto x = torch::randn({40, 6}), w = torch::randn({4, 6});
  {
    Pin off(false);
    EXPECT_TRUE(tiles_linear(x, w).equal(at::linear(x, w)));
  }
  Pin on(true);
  auto x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);
  EXPECT_TRUE(tiles_linear(x64, w64).equal(at::linear(x64, w64)));
  auto few = x.narrow(0, 0, 31);
  EXPECT_TRUE(tiles_linear(few, w).equal(at::linear(few, w)));
  EXPECT_THROW(tiles_linear(x, torch::randn({4, 5})), c10::Error);
}

// The backward's products into given tensors: dx = dy W written, dW written or added to, against
// float64, pinned (rows 600: two of dW's pieces) and unpinned (LibTorch's products).
TEST(TilesLinear, GradsIntoMatchFloat64) {
  torch::manual_seed(33);
  for (bool pinned : {true, false})
    for (bool accumulate : {false, true}) {
      Pin pin(pinned);
      auto dy = torch::randn({600, 21}), x = torch::randn({600, 37}), w = torch::randn({21, 37});
      auto dx = torch::full({600, 37}, 7.0), dw0 = torch::randn({21, 37}), dw = dw0.clone();
      linear_grads_into(dy, x, w, dx, dw, accumulate);
      auto f64 = [](const at::Tensor& t) { return t.to(torch::kFloat64); };
      auto dw_ref = f64(dy).t().mm(f64(x)) + (accumulate ? f64(dw0) : torch::zeros_like(f64(dw0)));
      EXPECT_TRUE(torch::allclose(f64(dx), f64(dy).mm(f64(w)), 1e-5, 1e-5)) << pinned << accumulate;
      EXPECT_TRUE(torch::allclose(f64(dw), dw_ref, 1e-5, 1e-4)) << pinned << accumulate;
    }
}
