// moe/softmax_top_k.h against LibTorch's composition (softmax, topk, gather, renormalisation,
// logsumexp) in float64, outputs and gradients; float32 within rounding; a hand-computed row.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "moe/select_rows.h"
#include "moe/softmax_top_k.h"

using namespace mf;

namespace {

struct Reference {
  at::Tensor probs, index, weight, lse;
};

Reference reference(const at::Tensor& z, int64_t K, bool renormalize, const at::Tensor& bias) {
  auto p = z.softmax(-1);
  auto key = (bias.defined() ? p + bias : p).detach();
  auto index = std::get<1>(key.topk(K, -1, true, true));
  auto w = p.gather(1, index);
  if (renormalize) w = w / w.sum(-1, true);
  return {p, index, w, z.logsumexp(-1)};
}

// a loss that reaches every output: the aux-style sum over probs, the weights, the z-loss's lse^2
at::Tensor loss(const at::Tensor& p, const at::Tensor& w, const at::Tensor& lse, const at::Tensor& up_p,
                const at::Tensor& up_w) {
  return (p * up_p).sum() + (w * up_w).sum() + lse.pow(2).sum();
}

}  // namespace

TEST(SoftmaxTopK, MatchesLibTorchInOutputsAndGradients) {
  torch::manual_seed(5);
  for (auto [T, E, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 8, 2}, {300, 128, 8}, {70, 5, 5}, {9, 256, 32}})
    for (bool renormalize : {true, false})
      for (bool biased : {false, true}) {
        const std::string what = "T " + std::to_string(T) + " E " + std::to_string(E) + " K " + std::to_string(K) +
                                 (renormalize ? " renormalised" : "") + (biased ? " biased" : "");
        auto z = (torch::randn({T, E}, torch::kFloat64) * 2).requires_grad_(true);
        auto bias = biased ? torch::randn({E}, torch::kFloat64) * 0.05 : at::Tensor();
        auto up_p = torch::randn({T, E}, torch::kFloat64), up_w = torch::randn({T, K}, torch::kFloat64);
        const auto ref = reference(z, K, renormalize, bias);
        const auto fast = softmax_top_k(z, K, renormalize, bias);
        ASSERT_TRUE(fast.index_TK.equal(ref.index)) << what;
        EXPECT_TRUE(torch::allclose(fast.probs_TE, ref.probs, 1e-13, 1e-15)) << what;
        EXPECT_TRUE(torch::allclose(fast.weight_TK, ref.weight, 1e-13, 1e-15)) << what;
        EXPECT_TRUE(torch::allclose(fast.lse_T, ref.lse, 1e-13, 1e-13)) << what;
        auto g_fast =
            torch::autograd::grad({loss(fast.probs_TE, fast.weight_TK, fast.lse_T, up_p, up_w)}, {z}, {}, true)[0];
        auto g_ref = torch::autograd::grad({loss(ref.probs, ref.weight, ref.lse, up_p, up_w)}, {z}, {}, true)[0];
        EXPECT_TRUE(torch::allclose(g_fast, g_ref, 1e-12, 1e-14)) << what;
        // each output's gradient path on its own (the others' gradients undefined)
        auto g_w = torch::autograd::grad({(fast.weight_TK * up_w).sum()}, {z}, {}, true)[0];
        auto g_w_ref = torch::autograd::grad({(ref.weight * up_w).sum()}, {z})[0];
        EXPECT_TRUE(torch::allclose(g_w, g_w_ref, 1e-12, 1e-14)) << what << " weights only";
        auto g_l = torch::autograd::grad({fast.lse_T.sum()}, {z})[0];
        EXPECT_TRUE(torch::allclose(g_l, ref.probs, 1e-13, 1e-15)) << what << " lse only";
      }
}

TEST(SoftmaxTopK, Float32WithinRoundingOfFloat64) {
  torch::manual_seed(6);
  auto z64 = torch::randn({600, 128}, torch::kFloat64) * 3;
  auto z32 = z64.to(torch::kFloat32).requires_grad_(true);
  const auto f = softmax_top_k(z32, 8, true);
  const auto ref = reference(z64, 8, true, {});
  EXPECT_TRUE(f.index_TK.equal(top_k_index(f.probs_TE.detach(), 8)));  // picks on its own probabilities
  EXPECT_TRUE(torch::allclose(f.probs_TE.to(torch::kFloat64), ref.probs, 1e-5, 1e-7));
  EXPECT_TRUE(torch::allclose(f.lse_T.to(torch::kFloat64), ref.lse, 1e-6, 1e-6));
  auto up_w = torch::randn({600, 8}, torch::kFloat64);
  auto g = torch::autograd::grad({(f.weight_TK * up_w.to(torch::kFloat32)).sum()}, {z32})[0];
  auto z = z64.clone().requires_grad_(true);
  auto w = reference(z, 8, true, {}).weight;
  auto g_ref = torch::autograd::grad({(w * up_w).sum()}, {z})[0];
  EXPECT_TRUE(torch::allclose(g.to(torch::kFloat64), g_ref, 1e-4, 1e-6));
}

// z = (0, ln 2, ln 3): p = (1, 2, 3) / 6, lse = ln 6; top-2 = units 2, 1 with weights 3/5, 2/5.
// d w_0 / d z (w_0 = p_2 / (p_1 + p_2) = 3 / (2 + 3) as a function of z_1, z_2 only):
// d/dz_2 = w_0 (1 - w_0) = 6/25, d/dz_1 = -w_0 w_1 = -6/25, d/dz_0 = 0.
TEST(SoftmaxTopK, HandComputedRow) {
  auto z = torch::tensor({{0.0, std::log(2.0), std::log(3.0)}}, torch::kFloat64).requires_grad_(true);
  const auto f = softmax_top_k(z, 2, true);
  EXPECT_TRUE(f.index_TK.equal(torch::tensor({{2, 1}}, torch::kLong)));
  EXPECT_TRUE(torch::allclose(f.probs_TE, torch::tensor({{1.0, 2.0, 3.0}}, torch::kFloat64) / 6, 1e-15, 1e-15));
  EXPECT_NEAR(f.weight_TK[0][0].item<double>(), 0.6, 1e-15);
  EXPECT_NEAR(f.weight_TK[0][1].item<double>(), 0.4, 1e-15);
  EXPECT_NEAR(f.lse_T[0].item<double>(), std::log(6.0), 1e-15);
  auto g = torch::autograd::grad({f.weight_TK.select(1, 0).sum()}, {z})[0];
  EXPECT_TRUE(torch::allclose(g, torch::tensor({{0.0, -6.0 / 25, 6.0 / 25}}, torch::kFloat64), 1e-14, 1e-15));
}

TEST(SoftmaxTopK, ClearErrorOnBadInput) {
  EXPECT_THROW(softmax_top_k(torch::zeros({4, 8}, torch::kInt), 2, true), c10::Error);
  EXPECT_THROW(softmax_top_k(torch::zeros({4, 8}), 9, true), c10::Error);
}
