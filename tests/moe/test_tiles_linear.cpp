// moe/tiles_linear.h against float64 at::linear: y, dx and dW, pinned on unit_gemm (ctest runs
// this at every SIMD level, tests/CMakeLists.txt), and unpinned where it falls back.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/tiles_linear.h"
#include "moe/unit_gemm.h"

using namespace mf;

namespace {

struct Pin {  // unit_gemm pinned on or off for a test, unpinned after
  explicit Pin(bool on) { force_unit_gemm(on); }
  ~Pin() { force_unit_gemm(std::nullopt); }
};

// max |ours - reference| over max |reference| for y, dx, dW (the loss sum(y * c) for a fixed c)
std::vector<double> errors(int64_t T, int64_t D, int64_t E, int threads) {
  at::set_num_threads(threads);
  auto x = torch::randn({T, D}).requires_grad_(true), w = torch::randn({E, D}).requires_grad_(true);
  auto c = torch::randn({T, E});
  auto y = tiles_linear(x, w);
  (y * c).sum().backward();
  auto x64 = x.detach().to(torch::kFloat64).requires_grad_(true),
       w64 = w.detach().to(torch::kFloat64).requires_grad_(true);
  auto y64 = at::linear(x64, w64);
  (y64 * c.to(torch::kFloat64)).sum().backward();
  std::vector<double> out;
  for (auto [got, ref] : {std::pair{y, y64}, {x.grad(), x64.grad()}, {w.grad(), w64.grad()}})
    out.push_back(ref.numel() ? (got.to(torch::kFloat64) - ref).abs().max().item<double>() /
                                    std::max(ref.abs().max().item<double>(), 1e-30)
                              : 0.0);
  at::set_num_threads(1);
  return out;
}

}  // namespace

// Shapes with rows, columns and depths that are not whole tiles, more tokens than one of dW's
// 512-token pieces (1100: pieces of 512, 512, 76 added up), fewer experts than a tile's rows, no
// tokens; 1 and 2 threads. Float32 against float64: a sum of up to 1100 products rounds to about
// 1e-6 of its size; a wrong row, piece or tail is off by the entry's own size.
TEST(TilesLinear, MatchesFloat64LinearWithGradients) {
  Pin pin(true);
  torch::manual_seed(31);
  for (int threads : {1, 2})
    for (auto [T, D, E] :
         {std::tuple{1100, 37, 13}, std::tuple{64, 512, 128}, std::tuple{5, 9, 3}, std::tuple{0, 8, 4}}) {
      const auto e = errors(T, D, E, threads);
      for (size_t i = 0; i < e.size(); ++i)
        EXPECT_LT(e[i], 1e-5) << fmt::format("T {} D {} E {} threads {}: {} off by {}", T, D, E, threads,
                                             std::vector<std::string>{"y", "dx", "dW"}[i], e[i]);
    }
}

TEST(TilesLinear, FallsBackToLinear) {
  Pin pin(false);
  torch::manual_seed(32);
  auto x = torch::randn({20, 6}), w = torch::randn({4, 6});
  EXPECT_TRUE(tiles_linear(x, w).equal(at::linear(x, w)));
  auto x64 = x.to(torch::kFloat64), w64 = w.to(torch::kFloat64);
  Pin on(true);  // float64 is never on unit_gemm
  EXPECT_TRUE(tiles_linear(x64, w64).equal(at::linear(x64, w64)));
  EXPECT_THROW(tiles_linear(x, torch::randn({4, 5})), c10::Error);
}
