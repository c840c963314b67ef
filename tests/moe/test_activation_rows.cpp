// The one-pass activation row kernels (moe/activation_rows.h) against LibTorch's ops on the same
// rows through autograd: float64 to rounding, float32 to a few ulps of exp and erf's 1.5e-7 (also
// where exp clamps); widths that are not whole vectors (M = 1, 7, 17) and whole ones (64); SwiGLU
// and GELU. ctest also runs these on the capped SIMD levels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "moe/activation_rows.h"

using namespace mf;

namespace {

struct ActivationRowsReference {
  at::Tensor a, dweight, wa, dh;
};

// y = sum_p w_p A_p W2^T: the same quantities through autograd
ActivationRowsReference activation_by_autograd(const at::Tensor& h, const at::Tensor& gw, const at::Tensor& w,
                                               bool swiglu) {
  auto hv = h.detach().clone().requires_grad_(true), wv = w.detach().clone().requires_grad_(true);
  const int64_t M = gw.size(1);
  auto a = swiglu ? torch::silu(hv.narrow(1, 0, M)) * hv.narrow(1, M, M) : torch::gelu(hv);
  auto wa = a * wv.unsqueeze(1);
  (wa * gw).sum().backward();  // d/dwa = gw: the upstream gradient through W2
  return {a.detach(), wv.grad(), wa.detach(), hv.grad()};
}

}  // namespace

TEST(ActivationRows, ForwardAndBackwardEqualLibTorchOps) {
  torch::manual_seed(12);
  for (bool swiglu : {true, false})
    for (auto dtype : {torch::kFloat64, torch::kFloat32})
      for (int64_t M : {1, 7, 17, 64}) {
        const int64_t P = 5, N = swiglu ? 2 * M : M;
        auto h64 = torch::randn({P, N}, torch::kFloat64) * 3;
        h64[0][0] = 100, h64[1][0] = -100, h64[2][0] = 87.5, h64[3][0] = -87.5;  // exp's clamped range
        auto h = h64.to(dtype);
        auto gw = torch::randn({P, M}, torch::kFloat64).to(dtype), w = torch::rand({P}, torch::kFloat64).to(dtype);
        const auto ref = activation_by_autograd(h, gw, w, swiglu);
        auto a = torch::empty({P, M}, dtype), wa = torch::empty({P, M}, dtype), dh = torch::empty({P, N}, dtype);
        auto dweight = torch::empty({P}, dtype);
        activation_forward_rows(h, a, swiglu);
        activation_backward_rows(h, gw, w, dweight, wa, dh, swiglu);
        const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-5;
        const std::string what = std::string(swiglu ? "swiglu " : "gelu ") +
                                 (dtype == torch::kFloat64 ? "float64" : "float32") + " M=" + std::to_string(M);
        EXPECT_TRUE(torch::allclose(a, ref.a, tol, tol)) << what << ": A";
        EXPECT_TRUE(torch::allclose(wa, ref.wa, tol, tol)) << what << ": w A";
        EXPECT_TRUE(torch::allclose(dweight, ref.dweight, tol, tol)) << what << ": dweight";
        EXPECT_TRUE(torch::allclose(dh, ref.dh, tol, tol)) << what << ": dH";
      }
}

TEST(ActivationRows, ShapesAreChecked) {
  auto h = torch::zeros({3, 8}), a = torch::zeros({3, 5});
  EXPECT_THROW(activation_forward_rows(h, a, true), c10::Error);
  EXPECT_THROW(activation_forward_rows(h, a, false), c10::Error);
  auto t = torch::zeros({8, 3}).t();  // [3, 8], not contiguous
  auto a4 = torch::zeros({3, 4});
  EXPECT_THROW(activation_forward_rows(t, a4, true), c10::Error);
}
