// SwiGLU's one-pass row kernels (moe/swiglu_rows.h) against LibTorch's ops on the same rows:
// float64 to rounding, float32 to a few ulps of exp (also where it clamps); widths that are not whole vectors (M = 1,
// 7, 17) and whole ones (64). ctest also runs these on the capped SIMD levels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/swiglu_rows.h"

using namespace mf;

namespace {

struct SwigluRowsReference {
  at::Tensor a, dweight, wa, dh;
};

// y = sum_p w_p A_p W2^T with A = silu(G) * U: the same quantities through autograd
SwigluRowsReference swiglu_by_autograd(const at::Tensor& h, const at::Tensor& gw, const at::Tensor& w) {
  const int64_t M = h.size(1) / 2;
  auto hv = h.detach().clone().requires_grad_(true), wv = w.detach().clone().requires_grad_(true);
  auto a = torch::silu(hv.narrow(1, 0, M)) * hv.narrow(1, M, M);
  auto wa = a * wv.unsqueeze(1);
  (wa * gw).sum().backward();  // d/dwa = gw: the upstream gradient through W2
  return {a.detach(), wv.grad(), wa.detach(), hv.grad()};
}

}  // namespace

TEST(SwigluRows, ForwardAndBackwardEqualLibTorchOps) {
  torch::manual_seed(12);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (int64_t M : {1, 7, 17, 64}) {
      const int64_t N = 5;
      auto h64 = torch::randn({N, 2 * M}, torch::kFloat64) * 3;
      h64[0][0] = 100, h64[1][0] = -100, h64[2][0] = 87.5, h64[3][0] = -87.5;  // exp's clamped range
      auto h = h64.to(dtype);
      auto gw = torch::randn({N, M}, torch::kFloat64).to(dtype), w = torch::rand({N}, torch::kFloat64).to(dtype);
      const auto ref = swiglu_by_autograd(h, gw, w);
      auto a = torch::empty({N, M}, dtype), wa = torch::empty({N, M}, dtype), dh = torch::empty({N, 2 * M}, dtype);
      auto dweight = torch::empty({N}, dtype);
      swiglu_forward_rows(h, a);
      swiglu_backward_rows(h, gw, w, dweight, wa, dh);
      const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
      const std::string what =
          std::string(dtype == torch::kFloat64 ? "float64" : "float32") + " M=" + std::to_string(M);
      EXPECT_TRUE(torch::allclose(a, ref.a, tol, tol)) << what << ": A";
      EXPECT_TRUE(torch::allclose(wa, ref.wa, tol, tol)) << what << ": w A";
      EXPECT_TRUE(torch::allclose(dweight, ref.dweight, tol, tol)) << what << ": dweight";
      EXPECT_TRUE(torch::allclose(dh, ref.dh, tol, tol)) << what << ": dH";
    }
}

TEST(SwigluRows, ShapesAreChecked) {
  auto h = torch::zeros({3, 8}), a = torch::zeros({3, 5});
  EXPECT_THROW(swiglu_forward_rows(h, a), c10::Error);
  auto t = torch::zeros({8, 3}).t();  // [3, 8], not contiguous
  auto a4 = torch::zeros({3, 4});
  EXPECT_THROW(swiglu_forward_rows(t, a4), c10::Error);
}
