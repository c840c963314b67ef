// Checkpoints written in shards by several ranks, read back as one, gathered into single files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "io/safetensors_shards.h"

using namespace mf;
namespace fs = std::filesystem;

namespace {

CheckpointContents sample_contents() {
  CheckpointContents c;
  c.model = {{"layers.0.w", torch::randn({10, 10})},                   // 400 bytes
             {"layers.0.b", torch::randn({75})},                       // 300
             {"norm", torch::randn({50})},                             // 200
             {"bias", torch::zeros({25}, torch::kFloat64).add_(1.5)},  // 200
             {"steps", torch::tensor({4}, torch::kLong)}};             // 8
  for (auto& [name, t] : c.model) c.optimizer.emplace_back(name + ".exp_avg", torch::randn_like(t.to(torch::kFloat)));
  c.model_metadata = {{"moeforge.config", "[train]\nsteps = 3\n"}, {"moeforge.vocab_size", "400"}};
  c.trainer_state = {{"step", 7}};
  return c;
}

// The protocol of three ranks, run one after the other (the barriers are the order itself).
void write_three_ranks(const fs::path& dir, const CheckpointContents& c) {
  begin_sharded_checkpoint(dir.string());
  for (int rank : {2, 1, 0}) write_checkpoint_shard(dir.string(), c, rank, 3);
  EXPECT_FALSE(fs::exists(dir)) << "the directory appears only once it is finished";
  finish_sharded_checkpoint(dir.string(), c, 3);
}

void expect_same(const SafetensorsData& read, const NamedTensors& written) {
  ASSERT_EQ(read.tensors.size(), written.size());
  for (auto& [name, t] : written) {
    EXPECT_TRUE(torch::equal(read.at(name), t)) << name;
    EXPECT_EQ(read.at(name).scalar_type(), t.scalar_type()) << name;
  }
}

}  // namespace

TEST(ShardedCheckpoint, PlanGivesTheLargestTensorToTheLeastLoadedRank) {
  // bytes 400, 300, 200, 200, 8 over 2 ranks: 400 -> 0; 300 -> 1; 200 -> 1 (300 < 400);
  // 200 -> 0 (400 < 500); 8 -> 1 (600 > 500)
  const auto c = sample_contents();
  EXPECT_EQ(shard_plan(c.model, 2), (std::vector<int>{0, 1, 1, 0, 1}));
  EXPECT_EQ(shard_plan(c.model, 1), (std::vector<int>(5, 0)));
  const auto many = shard_plan(c.model, 8);  // more ranks than tensors: one each, the rest empty
  EXPECT_EQ(many, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ShardedCheckpoint, ThreeRanksWriteOneCheckpointThatReadsBackWhole) {
  const auto root = fs::temp_directory_path() / fmt::format("mf_shards_{}", ::getpid());
  fs::remove_all(root);
  const auto c = sample_contents();
  const auto dir = root / "checkpoints" / "step_00000007";
  write_three_ranks(dir, c);
  for (auto* f :
       {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors", "optimizer-00002-of-00003.safetensors",
        "model.safetensors.index.json", "optimizer.safetensors.index.json", "trainer_state.json"})
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const auto index = read_json_file((dir / "model.safetensors.index.json").string());
  EXPECT_EQ(index["weight_map"]["layers.0.w"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 400 + 300 + 200 + 200 + 8);

  EXPECT_EQ(latest_checkpoint(root.string()), dir.string());
  auto ck = read_checkpoint(root.string());
  expect_same(ck.model, c.model);
  expect_same(ck.optimizer(), c.optimizer);
  EXPECT_EQ(ck.config_toml(), "[train]\nsteps = 3\n");
  EXPECT_EQ(ck.trainer_state()["step"], 7);
  EXPECT_EQ(checkpoint_config(dir.string()).train.steps, 3);  // the metadata of any shard

  // gathered into single files: the same tensors, the same state
  const auto single = root / "single";
  EXPECT_EQ(gather_checkpoint(root.string(), single.string()), 10);
  EXPECT_TRUE(fs::is_regular_file(single / "model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(single / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(single / "model.safetensors.index.json"));
  auto gathered = read_checkpoint(single.string());
  expect_same(gathered.model, c.model);
  expect_same(gathered.optimizer(), c.optimizer);
  EXPECT_EQ(gathered.metadata(), ck.metadata());
  EXPECT_EQ(gathered.trainer_state()["step"], 7);
  EXPECT_THROW(gather_checkpoint(single.string(), single.string()), std::invalid_argument);

  // a shard lost: the checkpoint is incomplete, so invisible, and reading it names the shard
  fs::remove(dir / "model-00002-of-00003.safetensors");
  EXPECT_EQ(latest_checkpoint(root.string()), "");
  try {
    SafetensorsShards(dir.string(), "model");
    FAIL() << "a missing shard went unnoticed";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00003.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(clean_checkpoint_leftovers((root / "checkpoints").string()), 1);
  fs::remove_all(root);
}

TEST(ShardedCheckpoint, AnIndexThatMisplacesATensorIsRefused) {
  const auto root = fs::temp_directory_path() / fmt::format("mf_shards_bad_{}", ::getpid());
  fs::remove_all(root);
  const auto c = sample_contents();
  write_three_ranks(root / "ck", c);
  const auto index_file = (root / "ck" / "model.safetensors.index.json").string();
  auto index = read_json_file(index_file);
  index["weight_map"]["norm"] = "model-00001-of-00003.safetensors";  // it is in another shard
  write_file_atomic(index_file, index.dump());
  EXPECT_THROW(read_checkpoint((root / "ck").string()), FormatError);
  index["weight_map"]["norm"] = "../elsewhere.safetensors";
  write_file_atomic(index_file, index.dump());
  EXPECT_THROW(read_checkpoint((root / "ck").string()), FormatError);
  fs::remove_all(root);
}
