#include "train/run_config.h"

#include <filesystem>
#include <stdexcept>

#include "io/checkpoint.h"
#include "io/model_io.h"

namespace mf {

Config run_config(const RunSource& s) {
  if (!s.config.empty()) return resolve_config(s.config, s.sets);
  const auto saved = std::filesystem::path(s.resume) / "config.toml";
  if (!s.resume.empty() && std::filesystem::is_regular_file(saved) && latest_checkpoint(s.resume).empty())
    return resolve_config(saved.string(), s.sets);  // killed before its first checkpoint: its config, from step 0
  if (s.resume.empty() && s.init_from.empty())
    throw std::invalid_argument("a config file, --resume or --init-from is needed");
  Config cfg = checkpoint_config(s.resume.empty() ? s.init_from : s.resume);
  for (const auto& set : s.sets) apply_override(cfg, set);
  validate(cfg);
  return cfg;
}

}  // namespace mf
