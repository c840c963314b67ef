// model/rope_rows.h against LibTorch's composition (rope_composed) in float64, outputs and
// gradients, on the attention's transposed views and at an offset into the tables; float32 within
// rounding; a rotation's gradient by hand.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "model/layers.h"
#include "model/rope_rows.h"

using namespace mf;

namespace {

// rope_rows against rope_composed on x (a leaf) and tables c, s: output and gradient under `up`
void expect_matches(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s, const at::Tensor& up, double rtol,
                    double atol) {
  const auto y = rope_rows(x, c, s), ref = rope_composed(x, c, s);
  EXPECT_TRUE(torch::allclose(y, ref, rtol, atol));
  const auto dx = torch::autograd::grad({(y * up).sum()}, {x})[0];
  const auto dx_ref = torch::autograd::grad({(ref * up).sum()}, {x})[0];
  EXPECT_TRUE(torch::allclose(dx, dx_ref, rtol, atol));
}

}  // namespace

TEST(RopeRows, MatchesLibTorchInOutputsAndGradients) {
  torch::manual_seed(6);
  for (auto [B, H, T, D, start] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{2, 3, 5, 8, 0}, {1, 4, 17, 34, 9}, {3, 2, 1, 2, 40}}) {
    const RopeTable table(64, D, 10000.0);
    const auto c = table.cos.narrow(0, start, T), s = table.sin.narrow(0, start, T);  // float64 tables
    auto x = torch::randn({B, T, H * D}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({B, H, T, D}, torch::kFloat64);
    auto view = [&] { return x.view({B, T, H, D}).transpose(1, 2); };  // as the attention hands q and k over
    const auto y = rope_rows(view(), c, s), ref = rope_composed(view(), c, s);
    const std::string what = "D " + std::to_string(D) + " start " + std::to_string(start);
    EXPECT_TRUE(torch::allclose(y, ref, 1e-14, 1e-15)) << what;
    EXPECT_TRUE(y.is_contiguous()) << what;
    const auto dx = torch::autograd::grad({(y * up).sum()}, {x})[0];
    const auto dx_ref = torch::autograd::grad({(ref * up).sum()}, {x})[0];
    EXPECT_TRUE(torch::allclose(dx, dx_ref, 1e-14, 1e-15)) << what;
  }
}

// tables whose halves differ (Hugging Face's repeat each half): every sine and cosine in its place
TEST(RopeRows, GeneralTablesMatchTheComposition) {
  torch::manual_seed(8);
  auto x = torch::randn({2, 3, 6, 10}, torch::kFloat64).requires_grad_(true);
  const auto c = torch::randn({6, 10}, torch::kFloat64), s = torch::randn({6, 10}, torch::kFloat64);
  expect_matches(x, c, s, torch::randn({2, 3, 6, 10}, torch::kFloat64), 1e-14, 1e-15);
}

TEST(RopeRows, Float32WithinRoundingAndContiguousInput) {
  torch::manual_seed(7);
  const RopeTable table(128, 32, 10000.0);
  auto x = torch::randn({4, 8, 128, 32}).requires_grad_(true);
  auto up = torch::randn({4, 8, 128, 32});
  expect_matches(x, table.cos.to(at::kFloat), table.sin.to(at::kFloat), up, 1e-6, 1e-6);
}

// D = 2 at angle a: y = (x0 cos a - x1 sin a, x1 cos a + x0 sin a); for g = (1, 0) the gradient
// is the first column of the rotation's transpose, (cos a, -sin a)
TEST(RopeRows, HandComputedGradient) {
  const double a = 0.7;
  auto c = torch::full({1, 2}, std::cos(a), torch::kFloat64), s = torch::full({1, 2}, std::sin(a), torch::kFloat64);
  auto x = torch::tensor({3.0, 4.0}, torch::kFloat64).view({1, 1, 1, 2}).requires_grad_(true);
  const auto y = rope_rows(x, c, s);
  EXPECT_NEAR(y[0][0][0][0].item<double>(), 3 * std::cos(a) - 4 * std::sin(a), 1e-15);
  EXPECT_NEAR(y[0][0][0][1].item<double>(), 4 * std::cos(a) + 3 * std::sin(a), 1e-15);
  const auto dx = torch::autograd::grad({y[0][0][0][0]}, {x})[0];
  EXPECT_NEAR(dx[0][0][0][0].item<double>(), std::cos(a), 1e-15);
  EXPECT_NEAR(dx[0][0][0][1].item<double>(), -std::sin(a), 1e-15);
}
