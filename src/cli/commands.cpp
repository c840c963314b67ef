#include "cli/commands.h"

namespace mf::cli {

void add_weight_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--dtype", dtype,
                  "hold the weights in f32, or in bf16: half the memory (embedding, head, attention, FFN and expert "
                  "matrices; norms, routers and method tensors stay f32), computed in float32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
}

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  cmd->add_option("--set", sets,
                  "override a config key, e.g. --set train.lr=1e-3 (repeatable; "
                  "`moeforge config --markdown` lists the keys)")
      ->type_name("KEY=VALUE");
}

}  // namespace mf::cli
