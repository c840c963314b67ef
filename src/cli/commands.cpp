#include "cli/commands.h"

namespace mf::cli {

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  cmd->add_option("--set", sets,
                  "override a config key, e.g. --set train.lr=1e-3 (repeatable; "
                  "`moeforge config --markdown` lists the keys)")
      ->type_name("KEY=VALUE");
}

}  // namespace mf::cli
