// FusedAdamW against LibTorch's AdamW: parameters and moments after several steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "train/fused_adamw.h"
#include "train/optim.h"

using namespace mf;

namespace {

struct OptimParams : torch::nn::Module {
  explicit OptimParams(at::ScalarType dtype) {
    a = register_parameter("a", torch::randn({37, 5}, dtype));
    b = register_parameter("b", torch::randn({300000}, dtype));       // spans several threads' chunks
    frozen = register_parameter("frozen", torch::randn({4}, dtype));  // never gets a gradient
  }
  at::Tensor a, b, frozen;
};

template <class Opt>
NamedTensors run(at::ScalarType dtype) {
  torch::manual_seed(11);
  OptimParams m(dtype);
  auto opts = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{m.a, m.frozen}, opts(0.1));
  groups.emplace_back(std::vector<at::Tensor>{m.b}, opts(0.0));
  Opt opt(groups, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 6; ++step) {
    set_lr(opt, 1e-2 / (step + 1));  // a schedule: the lr changes every step
    opt.zero_grad();
    ((m.a.sin() * m.a).sum() + (m.b * m.b * m.b).sum() * (step % 2 ? 1 : -1)).backward();
    opt.step();
  }
  auto out = optimizer_state_tensors(opt, m);
  for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  return out;
}

}  // namespace

TEST(FusedAdamW, MatchesLibTorchAdamW) {
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    auto fused = run<FusedAdamW>(dtype), ref = run<torch::optim::AdamW>(dtype);
    ASSERT_EQ(fused.size(), 2u * 3 + 3);  // a and b: moments and step; the frozen parameter has no state
    ASSERT_EQ(fused.size(), ref.size());
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_EQ(fused[i].first, ref[i].first);
      const auto x = fused[i].second.to(torch::kFloat64), y = ref[i].second.to(torch::kFloat64);
      EXPECT_TRUE(torch::allclose(x, y, tol, tol))
          << fused[i].first << " max diff " << (x - y).abs().max().item<double>();
    }
  }
}

// release_grads + restore_zero_grads against zero_grad: a parameter used in the first step only
// (its gradient zero, not absent, afterwards), one never used, one used in every step: the same
// parameters and moments bit for bit after the steps.
TEST(ReleaseGrads, UpdatesEqualZeroGrad) {
  auto steps = [](bool release) {
    torch::manual_seed(12);
    OptimParams m(torch::kFloat32);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(
        std::vector<at::Tensor>{m.a, m.b, m.frozen},
        std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
    torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 3; ++step) {
      std::vector<at::Tensor> had;
      if (release) {
        had = release_grads(opt);
        for (auto& p : had) EXPECT_FALSE(p.grad().defined());
      } else {
        opt.zero_grad();
      }
      auto loss = (m.a.sin() * m.a).sum();
      if (step == 0) loss = loss + (m.b * m.b).sum();  // b: a gradient in the first step only
      loss.backward();
      if (release) {
        restore_zero_grads(had);
        if (step > 0) {
          EXPECT_TRUE(m.b.grad().defined() && m.b.grad().eq(0).all().item<bool>());
        }
        EXPECT_FALSE(m.frozen.grad().defined());
      }
      opt.step();
    }
    auto out = optimizer_state_tensors(opt, m);
    for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
    return out;
  };
  const auto zeroed = steps(false), released = steps(true);
  ASSERT_EQ(zeroed.size(), released.size());
  for (size_t i = 0; i < zeroed.size(); ++i) EXPECT_TRUE(zeroed[i].second.equal(released[i].second)) << zeroed[i].first;
}
