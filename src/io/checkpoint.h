// Checkpoint directories: model.safetensors (HF-named weights; resolved config in the
// metadata), optimizer.safetensors, trainer_state.json and tokenizer.model.
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

struct Checkpoint {
  std::string dir;
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
std::string config_toml_of(const Metadata& model_metadata, const std::string& dir);  // moeforge.config
std::string latest_checkpoint(const std::string& run_dir);                           // "" if none
// Keeps the `keep` newest; each older one leaves the step_* namespace by a rename before it is deleted.
void prune_checkpoints(const std::string& ckpt_root, int64_t keep);
// Removes what a killed run left under `ckpt_root` (.tmp-*, .del-*, incomplete step_*); returns how many.
int clean_checkpoint_leftovers(const std::string& ckpt_root);

}  // namespace mf
