// model/rms_norm_rows.h against LibTorch's composition (rms_norm_composed) in float64, outputs and
// both gradients, each alone and together; float32 within rounding; a row's gradient by hand.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/rms_norm_rows.h"

using namespace mf;

namespace {

struct Grads {
  at::Tensor y, dx, dw;
};

Grads run(bool fast, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& up, bool want_x, bool want_w,
          double eps) {
  auto x = x0.clone().requires_grad_(want_x), w = w0.clone().requires_grad_(want_w);
  auto y = fast ? rms_norm_rows(x, w, eps) : rms_norm_composed(x, w, eps);
  (y * up).sum().backward();
  return {y.detach(), want_x ? x.grad() : at::Tensor(), want_w ? w.grad() : at::Tensor()};
}

}  // namespace

TEST(RmsNormRows, MatchesLibTorchInOutputsAndGradients) {
  torch::manual_seed(3);
  for (auto shape : {std::vector<int64_t>{3, 5, 37}, {1, 8}, {300, 128}, {2, 3, 4, 16}})
    for (auto [want_x, want_w] : {std::pair{true, true}, {true, false}, {false, true}}) {
      const int64_t D = shape.back();
      auto x = torch::randn(shape, torch::kFloat64) * 3, w = torch::randn({D}, torch::kFloat64);
      auto up = torch::randn(shape, torch::kFloat64);
      const auto fast = run(true, x, w, up, want_x, want_w, 1e-5), ref = run(false, x, w, up, want_x, want_w, 1e-5);
      const std::string what = "D " + std::to_string(D) + (want_x ? " dx" : "") + (want_w ? " dw" : "");
      EXPECT_TRUE(torch::allclose(fast.y, ref.y, 1e-13, 1e-15)) << what;
      if (want_x) {
        EXPECT_TRUE(torch::allclose(fast.dx, ref.dx, 1e-12, 1e-14)) << what;
      }
      if (want_w) {
        EXPECT_TRUE(torch::allclose(fast.dw, ref.dw, 1e-12, 1e-13)) << what;
      }
    }
}

TEST(RmsNormRows, Float32WithinRoundingAndStridedInput) {
  torch::manual_seed(4);
  auto x = torch::randn({64, 6, 40}).transpose(0, 1);  // [6, 64, 40], rows not contiguous
  auto w = torch::rand({40}) + 0.5, up = torch::randn({6, 64, 40});
  const auto fast = run(true, x, w, up, true, true, 1e-6), ref = run(false, x, w, up, true, true, 1e-6);
  EXPECT_TRUE(torch::allclose(fast.y, ref.y, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fast.dx, ref.dx, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(fast.dw, ref.dw, 1e-4, 1e-4));
}

// x = (3, 4), w = (1, 1), eps 0, g = (1, 0): r = 1 / sqrt(12.5); dx = r g - x r^3 (g . x) / 2,
// dw = g x r
TEST(RmsNormRows, HandComputedGradient) {
  auto x = torch::tensor({{3.0, 4.0}}, torch::kFloat64).requires_grad_(true);
  auto w = torch::ones({2}, torch::kFloat64).requires_grad_(true);
  (rms_norm_rows(x, w, 0.0) * torch::tensor({{1.0, 0.0}}, torch::kFloat64)).sum().backward();
  const double r = 1.0 / std::sqrt(12.5), r3 = r * r * r;
  EXPECT_NEAR(x.grad()[0][0].item<double>(), r - 3 * r3 * 1.5, 1e-15);  // 0.181019335...
  EXPECT_NEAR(x.grad()[0][1].item<double>(), -4 * r3 * 1.5, 1e-15);     // -0.135764502...
  EXPECT_NEAR(w.grad()[0].item<double>(), 3 * r, 1e-15);
  EXPECT_EQ(w.grad()[1].item<double>(), 0.0);
}

// the weight's gradient sums fixed blocks of rows in order: the same bits on 1 and 2 threads
TEST(RmsNormRows, WeightGradientDoesNotDependOnThreads) {
  torch::manual_seed(5);
  auto x = torch::randn({1000, 48}), w = torch::randn({48}), up = torch::randn({1000, 48});
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = run(true, x, w, up, true, true, 1e-5);
  at::set_num_threads(2);
  const auto two = run(true, x, w, up, true, true, 1e-5);
  at::set_num_threads(before);
  EXPECT_TRUE(one.dw.equal(two.dw));
  EXPECT_TRUE(one.dx.equal(two.dx));
}
