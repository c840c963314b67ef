// Where calibration tokens come from: a domain of the prepared corpus (its train split, the
// data a domain fine-tune sees), a text file (tokenized with the checkpoint's tokenizer), or
// a token shard as `moeforge prepare` writes them (tokens/<domain>_<split>.bin).
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "core/config.h"

namespace mf {

struct CalibrationSource {
  std::string source;     // domain name, "domain:NAME", a .txt file or a .bin token shard
  int64_t samples = 256;  // windows
  int64_t seq_len = 0;    // 0 = train.seq_len
  std::string data_dir;   // prepared corpus (default: the config's data.dir)
  // the dtype the model's weights are held in for the calibration pass (model/weight_dtype.h;
  // the in-memory pass: --layerwise holds one float32 block at a time)
  at::ScalarType weights = at::kFloat;
};

// `samples` windows [N, L] spread evenly over the source's tokens (no randomness). Throws
// std::invalid_argument naming the source when it is neither a domain nor a readable file.
at::Tensor calibration_windows(const CalibrationSource& s, const Config& cfg, const std::string& tokenizer_path);

// "technical" or "domain:technical" -> "technical"; a path -> its file stem (report names)
std::string calibration_label(const std::string& source);

}  // namespace mf
