// The kernel case table (train/kernel_cases.h), the one list `moeforge bench kernels` times:
// every case at its test shape against its reference, in float64 and float32, on one and two
// threads (the threaded paths), at the SIMD level this run has (ctest also runs it capped at
// MOEFORGE_SIMD=base and avx2). What this machine cannot run is printed and recorded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <set>

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
  std::string said;
  for (auto& n : not_run) {
    std::cout << "[ NOT RUN  ] " << n << "\n";
    said += (said.empty() ? "" : "; ") + n;
  }
  ::testing::Test::RecordProperty("not_run", said);
}

TEST(KernelCases, RelativeErrorIsScaledByTheReference) {
  const auto a = torch::tensor({1.0, 2.0}), b = torch::tensor({1.0, 4.0});
  EXPECT_DOUBLE_EQ(relative_error({a}, {b}), 0.5);        // |2 - 4| / 4
  EXPECT_DOUBLE_EQ(relative_error({a, b}, {a, a}), 1.0);  // the worst output: |4 - 2| / 2
  EXPECT_DOUBLE_EQ(relative_error({torch::zeros({2})}, {torch::zeros({2})}), 0.0);
}
