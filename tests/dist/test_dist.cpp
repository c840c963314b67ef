// dist/: the expert-parallel traffic model of `bench comm` (the collectives themselves are
// tested across processes by tests/dist/data_parallel.sh).
#include <gtest/gtest.h>

#include "dist/comm_bench.h"

namespace mf {
namespace {

TEST(CommBench, ExpertParallelBytesByHand) {
  // 4096 tokens x top-8 = 32,768 rows of 2048 floats (8 KiB each); 7/8 of them leave the rank;
  // dispatch + combine, forward + backward: 4 exchanges -> 4 * 32768 * 0.875 * 8192 bytes
  EXPECT_DOUBLE_EQ(expert_parallel_bytes(4096, 2048, 8, 8), 939524096.0);
  EXPECT_DOUBLE_EQ(expert_parallel_bytes(10, 4, 2, 1), 0.0);  // one rank: nothing leaves
  EXPECT_DOUBLE_EQ(expert_parallel_bytes(10, 4, 2, 2), 4.0 * 20 * 0.5 * 16);
}

}  // namespace
}  // namespace mf
