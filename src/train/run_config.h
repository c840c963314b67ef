// The config a `train` invocation runs: a TOML file with --set overrides, or, without a file,
// the config of the run or checkpoint it resumes or starts from.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"

namespace mf {

struct RunSource {
  std::string config;             // TOML file; "" = take it from resume / init_from
  std::vector<std::string> sets;  // --set key=value, applied last
  std::string resume, init_from;  // TrainOptions' fields of the same name
};

// Throws ConfigError (naming the key or file) for a bad config, std::invalid_argument when
// there is nothing to take a config from.
Config run_config(const RunSource& s);

}  // namespace mf
