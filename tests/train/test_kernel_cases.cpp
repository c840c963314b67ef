// The kernel case table (train/kernel_cases.h), the one list `moeforge bench kernels` times:
// every case at its test shape against its reference, in float64 and float32, on one and two
// threads (the threaded paths), at the SIMD level this run has (ctest also runs it capped at
// MOEFORGE_SIMD=base and avx2). What this machine cannot run is printed and recorded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include "core/simd.h"
#include "train/kernel_cases.h"

using namespace mf;

TEST(KernelCases, EveryCaseMatchesItsFloat64Reference) {
  std::set<std::string> not_run;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    const auto cases64 = kernel_cases(CaseSize::Test, at::kDouble), cases32 = kernel_cases(CaseSize::Test, at::kFloat);
    ASSERT_EQ(cases64.size(), cases32.size());
    for (size_t i = 0; i < cases64.size(); ++i) {
      const auto &c64 = cases64[i], &c32 = cases32[i];
      const auto what = c64.kernel + " [" + c64.shape + "], " + std::to_string(threads) + " threads";
      EXPECT_GT(c64.flops, 0) << what;
      const auto ref = c64.reference();
      for (auto& t : ref) EXPECT_GT(t.abs().max().item<double>(), 0) << what << ": a zero reference proves nothing";
      if (c64.runs) {
        EXPECT_LT(relative_error(c64.ours(), ref), 1e-10) << what << ", float64";
      }
      if (c32.runs) {
        EXPECT_LT(relative_error(c32.ours(), ref), c32.tolerance) << what << ", float32";
      } else {
        not_run.insert(c32.kernel + ": " + c32.why);
      }
    }
  }
  at::set_num_threads(1);
  // the instruction sets above this run's level: their variants went untested here
  const bool capped = std::getenv("MOEFORGE_SIMD") != nullptr;
  const char* why = capped ? "MOEFORGE_SIMD caps this run below them" : "this CPU lacks them";
  if (simd_level() != SimdLevel::Avx512) not_run.insert(std::string("the AVX-512 variants of our kernels: ") + why);
  if (simd_level() == SimdLevel::Base) not_run.insert(std::string("the AVX2 + FMA variants of our kernels: ") + why);
  std::string said;
  for (auto& n : not_run) {
    std::cout << "[ NOT RUN  ] " << n << "\n";
    said += (said.empty() ? "" : "; ") + n;
  }
  ::testing::Test::RecordProperty("not_run", said);
}

// The FLOP counts bench kernels divides by, by hand at the test shapes.
TEST(KernelCases, FlopCountsByHand) {
  std::map<std::string, double> flops;
  for (const auto& c : kernel_cases(CaseSize::Test, at::kDouble)) flops[c.kernel] = c.flops;
  EXPECT_DOUBLE_EQ(flops.at("combine (weighted scatter-add), fwd+bwd"), 5.0 * 296 * 24);  // P = 37 x 8, D = 24
  EXPECT_DOUBLE_EQ(flops.at("gather rows (combine's adjoint), fwd+bwd"), 296.0 * 24);
  // the selections count one operation per score (T 37 x E 24) and per pair (300)
  EXPECT_DOUBLE_EQ(flops.at("top-k per token (router)"), 37.0 * 24);
  EXPECT_DOUBLE_EQ(flops.at("softmax router (probs, top-k, weights, lse), fwd+bwd"), 37.0 * 24);
  EXPECT_DOUBLE_EQ(flops.at("pairs in unit order (stable)"), 300.0);
  // fwd + bwd of SwiGLU experts: 3 matrices of D x F, 2 flops a multiply-add, 3 passes; P = 29 x 2
  EXPECT_DOUBLE_EQ(flops.at("grouped units (training), fwd+bwd"), 18.0 * 58 * 16 * 12);
  EXPECT_DOUBLE_EQ(flops.at("combined units (training), fwd+bwd"), 18.0 * 58 * 16 * 12);
  EXPECT_DOUBLE_EQ(flops.at("combined units (training), unit GEMMs pinned"), 18.0 * 58 * 16 * 12);
  // y = x W^T + b, dx, dW: three M x K x N products of 2 flops a multiply-add
  EXPECT_DOUBLE_EQ(flops.at("linear, float32 (unit GEMMs), fwd+bwd"), 6.0 * 70 * 37 * 21);
  // GELU: 2 matrices of D x F per whole expert, P = 53 x 2; blocks: a B-th of them, P = 53 x 13
  EXPECT_DOUBLE_EQ(flops.at("combined units, inference (whole experts)"), 4.0 * 106 * 20 * 24);
  EXPECT_DOUBLE_EQ(flops.at("combined units, inference (blocks)"), 4.0 * 689 * 20 * 24 / 8);
  EXPECT_DOUBLE_EQ(flops.at("small attention, fwd+bwd"), 12.0 * 3 * 4 * 17 * 17 * 8);
  EXPECT_DOUBLE_EQ(flops.at("AdamW, 3 steps"), 3.0 * 14 * (37 * 5 + 300000));
  EXPECT_DOUBLE_EQ(flops.at("linear, bf16 weights (row kernel, one row)"), 2.0 * 1 * 37 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, bf16 weights (row kernel, two rows)"), 2.0 * 2 * 37 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, bf16 weights (row kernel)"), 2.0 * 7 * 37 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, bf16 weights (panels)"), 2.0 * 131 * 37 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, int8 weights (row kernel, one row)"), 2.0 * 1 * 96 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, int8 weights (row kernel, two rows)"), 2.0 * 2 * 96 * 21);
  EXPECT_DOUBLE_EQ(flops.at("linear, int8 weights (panels)"), 2.0 * 131 * 96 * 21);
}

TEST(KernelCases, RelativeErrorIsScaledByTheReference) {
  const auto a = torch::tensor({1.0, 2.0}), b = torch::tensor({1.0, 4.0});
  EXPECT_DOUBLE_EQ(relative_error({a}, {b}), 0.5);        // |2 - 4| / 4
  EXPECT_DOUBLE_EQ(relative_error({a, b}, {a, a}), 1.0);  // the worst output: |4 - 2| / 2
  EXPECT_DOUBLE_EQ(relative_error({torch::zeros({2})}, {torch::zeros({2})}), 0.0);
}
