#include "cli/commands.h"

namespace mf::cli {

Config resolve_config(const std::string& path, const std::vector<std::string>& sets) {
  Config cfg = path.empty() ? Config{} : load_config(path);
  for (const auto& s : sets) apply_override(cfg, s);
  validate(cfg);
  return cfg;
}

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  cmd->add_option("--set", sets,
                  "override a config key, e.g. --set train.lr=1e-3 (repeatable; "
                  "`moeforge config --markdown` lists the keys)")
      ->type_name("KEY=VALUE");
}

}  // namespace mf::cli
