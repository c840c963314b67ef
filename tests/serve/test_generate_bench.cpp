// bench generate's batch-1 rounds against the bandwidth bound measured beside them, by hand.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include "serve/generate_bench.h"

using namespace mf;

// reads 40, 60, 50, 30 GB/s around decodes of 100, 120, 90 step tokens/s at 0.5 GB a step: bounds
// of 60, 60 and 50 GB/s (the faster neighbour), ratios 100 x 0.5 / 60 = 0.833, 120 x 0.5 / 60 = 1.0,
// 90 x 0.5 / 50 = 0.9: the median round is the third
TEST(GenerateBench, BatchOneTakesTheMedianRoundAgainstTheFasterOfItsTwoReads) {
  std::vector<GenerateBenchRow> rounds(3);
  const double rates[] = {100, 120, 90};
  for (int i = 0; i < 3; ++i) rounds[i].step_tokens_per_s = rates[i], rounds[i].tokens_per_s = 10.0 * i;
  const auto row = median_beside_bound(rounds, {40, 60, 50, 30}, 0.5e9);
  EXPECT_DOUBLE_EQ(row.vs_bound, 0.9);
  EXPECT_DOUBLE_EQ(row.read_gbs, 50);
  EXPECT_DOUBLE_EQ(row.tokens_per_s, 20);  // the whole row is that round's
  EXPECT_THROW(median_beside_bound(rounds, {40, 60, 50}, 0.5e9), c10::Error);
}
