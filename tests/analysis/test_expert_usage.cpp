// The expert-usage record survives its JSON: a repro whose run checkpoints are gone redraws the
// heatmaps from the measurement kept beside the run.
#include <gtest/gtest.h>

#include "analysis/expert_usage.h"

using namespace mf;

TEST(ExpertUsage, JsonRoundTripKeepsCountsGroupsAndHistograms) {
  ExpertUsage u;
  u.layers = {0, 1, 2};
  u.group = {0, 0, -1};                          // rows 0 and 1 share one pool of 3, row 2 has its own 3
  u.counts = {{5, 0, 1}, {0, 0, 2}, {0, 4, 4}};  // pool: 5, 0, 3 (one dead); own: 0 dead once
  u.token_counts = {{{"active_blocks", {1, 2}}}, {}, {}};
  u.loss = {{"scripture", 4.5, 10}};
  const auto back = ExpertUsage::from_json(u.to_json());
  EXPECT_EQ(back.layers, u.layers);
  EXPECT_EQ(back.group, u.group);
  EXPECT_EQ(back.counts, u.counts);
  EXPECT_EQ(back.token_counts, u.token_counts);
  ASSERT_EQ(back.loss.size(), 1u);
  EXPECT_EQ(back.loss[0].domain, "scripture");
  EXPECT_DOUBLE_EQ(back.loss[0].loss, 4.5);
  EXPECT_EQ(back.stored_experts(), 6);
  EXPECT_EQ(back.globally_dead(), 2);  // the pool's expert 1 and layer 2's expert 0
  EXPECT_EQ(back.to_json().dump(), u.to_json().dump());
}
