// train --profile: operator self times from a Chrome trace, by hand; bench train's FLOP count.
#include <gtest/gtest.h>

#include "train/profile.h"
#include "train/train_bench.h"

using namespace mf;

TEST(Profile, SelfTimeSubtractsChildrenPerThread) {
  // thread 1: A [0, 100) holds B [10, 40) which holds C [15, 25), and D [50, 70);
  // a later A [200, 210) alone; thread 2: C [5, 95) overlapping A in time but not its child.
  auto ev = [](const char* name, double ts, double dur, int tid) {
    return nlohmann::json{{"name", name}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"tid", tid}};
  };
  nlohmann::json trace = nlohmann::json::array({ev("B", 10, 30, 1),
                                                ev("A", 0, 100, 1),
                                                ev("C", 15, 10, 1),
                                                ev("D", 50, 20, 1),
                                                ev("A", 200, 10, 1),
                                                ev("C", 5, 90, 2),
                                                {{"name", "meta"}, {"ph", "M"}}});
  const auto ops = self_times(trace);
  std::map<std::string, OpSelfTime> by;
  for (auto& o : ops) by[o.name] = o;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_DOUBLE_EQ(by["A"].self_us, 100 - 30 - 20 + 10);  // both calls, children excluded
  EXPECT_EQ(by["A"].calls, 2);
  EXPECT_DOUBLE_EQ(by["B"].self_us, 30 - 10);
  EXPECT_DOUBLE_EQ(by["C"].self_us, 10 + 90);
  EXPECT_DOUBLE_EQ(by["D"].self_us, 20);
  EXPECT_EQ(ops.front().name, "C");  // largest self time first
  // wrapped in {"traceEvents": [...]} as well; the table divides by the steps
  EXPECT_DOUBLE_EQ(self_times(nlohmann::json{{"traceEvents", trace}})[0].self_us, 100);
  const auto table = self_time_table(ops, 2);
  const auto c_row = table.substr(table.find("\nC "), table.find('\n', table.find("\nC ") + 1) - table.find("\nC "));
  EXPECT_NE(c_row.find(" 0.05 "), std::string::npos) << table;  // 100 us over 2 steps, in ms
  EXPECT_NE(c_row.find("50.0%"), std::string::npos) << table;   // of 200 us in all
}

TEST(TrainBench, FlopsPerTokenByHand) {
  // 6 x (active - embedding table) + 6 L T H Dh: d = 8, V = 10, L = 2, 2 heads of width 4, T = 16;
  // active 1,000 -> 6 x (1,000 - 80) + 6 x 2 x 16 x 2 x 4 = 5,520 + 1,536
  ModelConfig m;
  m.d_model = 8;
  m.vocab_size = 10;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  EXPECT_DOUBLE_EQ(train_flops_per_token(m, 16, 1000), 7056.0);
  // a ViT: every parameter counts, attention is bidirectional: 6 x 1,000 + 12 x 2 x 17 x 2 x 4 = 6,000 + 3,264
  m.task = "classify";
  EXPECT_DOUBLE_EQ(train_flops_per_token(m, 17, 1000), 9264.0);
  // a 3x3 stem of 2 channels on a 1-channel 4x4 image, 2 tokens: its 2 x 10 parameters apply at 16 pixels,
  // i.e. 8 per token, 7 more than the once counted in the active parameters: + 6 x 20 x 7
  m.image_size = 4;
  m.stem_channels = 2;
  EXPECT_DOUBLE_EQ(train_flops_per_token(m, 2, 1000), 6000.0 + 12.0 * 2 * 2 * 2 * 4 + 840.0);
  Config c;
  c.model.task = "classify";
  c.model.image_size = 28;
  c.model.patch_size = 7;
  EXPECT_EQ(tokens_per_item(c), 17);  // 4 x 4 patches + the class token
  c.model.task = "lm";
  c.train.seq_len = 128;
  EXPECT_EQ(tokens_per_item(c), 128);
}
