// Checkpoint directories: model.safetensors (HF-named weights; resolved config in the
// metadata), optimizer.safetensors, trainer_state.json and tokenizer.model. A run over W ranks
// writes each of the two safetensors as W shards plus an index (io/safetensors_shards.h).
// Written into a temporary directory, every file fsynced, then renamed into place.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"

namespace mf {

struct CheckpointContents {
  NamedTensors model, optimizer;
  Metadata model_metadata;
  nlohmann::json trainer_state;
  std::string tokenizer_file;  // copied in, so a checkpoint is self-contained
  // When set, writes model.safetensors at the path it is given (streamed) instead of `model`.
  std::function<void(const std::string& path)> write_model = nullptr;
};

void write_checkpoint(const std::string& dir, const CheckpointContents& c);

// One checkpoint written by W ranks that share the filesystem, each storing the tensors
// shard_plan gives it; the directory appears (one rename) only once every shard is there:
//   rank 0: begin_sharded_checkpoint; barrier;
//   every rank: write_checkpoint_shard; barrier;
//   rank 0: finish_sharded_checkpoint (indexes, trainer state, tokenizer, rename).
// Every rank passes the same tensor lists (the parameters are replicated).
void begin_sharded_checkpoint(const std::string& dir);
void write_checkpoint_shard(const std::string& dir, const CheckpointContents& c, int rank, int world);
void finish_sharded_checkpoint(const std::string& dir, const CheckpointContents& c, int world);
// The rank that stores each tensor: whole tensors, the largest first to the least loaded rank.
std::vector<int> shard_plan(const NamedTensors& tensors, int world);

struct Checkpoint {
  std::string dir;  // the model and optimizer tensors: single files or shards, gathered on reading
  SafetensorsData model;
  Metadata metadata() const { return model.metadata; }
  std::string tokenizer_path() const;
  std::string config_toml() const;  // from the model metadata
  nlohmann::json trainer_state() const;
  SafetensorsData optimizer() const;  // loaded on demand
};

// `path` is a checkpoint directory, its model.safetensors, or a run directory (its latest checkpoint).
Checkpoint read_checkpoint(const std::string& path);
std::string checkpoint_dir(const std::string& path);  // the directory read_checkpoint would read, nothing loaded
// `checkpoint` (any world size) -> a directory `out` of single files; returns the tensors written.
int64_t gather_checkpoint(const std::string& checkpoint, const std::string& out);
std::string config_toml_of(const Metadata& model_metadata, const std::string& dir);  // moeforge.config
std::string latest_checkpoint(const std::string& run_dir);                           // "" if none
// Keeps the `keep` newest; each older one leaves the step_* namespace by a rename before it is deleted.
void prune_checkpoints(const std::string& ckpt_root, int64_t keep);
// Removes what a killed run left under `ckpt_root` (.tmp-*, .del-*, incomplete step_*); returns how many.
int clean_checkpoint_leftovers(const std::string& ckpt_root);

}  // namespace mf
