// serve/sampling.h: the nucleus against softmax -> top_p_filter in float64, a hand-computed case
// with ties at the edge, draws against their probabilities, and bad logits named.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "serve/generate.h"
#include "serve/sampling.h"

using namespace mf;

namespace {

std::vector<double> probs_of(const std::vector<float>& logits, double temperature, double top_p) {
  std::vector<double> p(logits.size());
  nucleus_probs(logits.data(), static_cast<int64_t>(logits.size()), temperature, top_p, p.data());
  return p;
}

std::vector<float> log_of(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back(static_cast<float>(std::log(v)));
  return l;
}

}  // namespace

TEST(Sampling, NucleusEqualsSoftmaxThenTopPFilterInFloat64) {
  for (int64_t seed : {1, 2, 3})
    for (double temperature : {0.5, 1.0, 1.7})
      for (double top_p : {0.3, 0.9, 1.0}) {
        torch::manual_seed(seed);
        const auto logits = torch::randn({1000}) * 3;
        const std::vector<float> l(logits.data_ptr<float>(), logits.data_ptr<float>() + 1000);
        const auto want = top_p_filter(torch::softmax(logits.to(torch::kFloat64) / temperature, -1), top_p);
        const auto got = torch::tensor(probs_of(l, temperature, top_p), torch::kFloat64);
        EXPECT_TRUE(torch::equal(got > 0, want > 0)) << "seed " << seed << " T " << temperature << " top_p " << top_p;
        EXPECT_LT((got - want).abs().max().item<double>(), 1e-6) << "seed " << seed << " T " << temperature;
      }
}

TEST(Sampling, HandComputedNucleusKeepsTiesInIndexOrder) {
  // 0.5 + 0.3 reaches 0.7: the two most probable, renormalised
  auto p = probs_of(log_of({0.1, 0.5, 0.3, 0.1}), 1.0, 0.7);
  const std::vector<double> want = {0, 0.625, 0.375, 0};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(p[i], want[i], 1e-6) << i;
  // 0.4 first; of the tied 0.2s the first in index order (mass before it 0.4 < 0.5), not the
  // others (0.6 before the second)
  p = probs_of(log_of({0.2, 0.4, 0.2, 0.2}), 1.0, 0.5);
  const std::vector<double> ties = {1.0 / 3, 2.0 / 3, 0, 0};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(p[i], ties[i], 1e-6) << i;
  // -inf never; temperature 2 halves the logits: e^-1 against e^0
  p = probs_of({-INFINITY, 0.0f, -2.0f}, 2.0, 1.0);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_NEAR(p[1], 1 / (1 + std::exp(-1.0)), 1e-6);
}

TEST(Sampling, DrawsFollowTheNucleusProbabilities) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto logits = log_of({0.1, 0.5, 0.3, 0.1});
  const int n = 40000;
  for (double top_p : {1.0, 0.7}) {
    const auto p = probs_of(logits, 1.0, top_p);
    std::vector<int> count(4);
    for (int i = 0; i < n; ++i) ++count[sample_token(logits.data(), 4, 1.0, top_p, gen)];
    for (size_t i = 0; i < 4; ++i) {
      const double f = static_cast<double>(count[i]) / n, sigma = std::sqrt(p[i] * (1 - p[i]) / n);
      EXPECT_LE(std::abs(f - p[i]), 5 * sigma + 1e-12) << "token " << i << " top_p " << top_p;
    }
  }
}

TEST(Sampling, SameSeedSameDrawsAndBadLogitsNamed) {
  torch::manual_seed(5);
  const auto t = torch::randn({300});
  const std::vector<float> l(t.data_ptr<float>(), t.data_ptr<float>() + 300);
  auto a = at::make_generator<at::CPUGeneratorImpl>(3), b = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(sample_token(l.data(), 300, 0.8, 0.9, a), sample_token(l.data(), 300, 0.8, 0.9, b));
  for (float bad : {NAN, INFINITY}) {
    auto v = l;
    v[17] = bad;
    try {
      sample_token(v.data(), 300, 0.8, 0.9, a);
      ADD_FAILURE() << bad << " was sampled from";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("logit 17"), std::string::npos) << e.what();
    }
  }
  std::vector<float> none(4, -INFINITY);
  EXPECT_THROW(sample_token(none.data(), 4, 1.0, 1.0, a), c10::Error);
}
