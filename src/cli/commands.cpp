#include "cli/commands.h"

namespace mf::cli {

void add_weight_dtype_option(CLI::App* cmd, std::string& dtype, bool int8) {
  const std::string help =
      "hold the weights in f32, or in bf16: half the memory (embedding, head, attention, FFN and expert matrices; "
      "norms, routers and method tensors stay f32), computed in float32";
  if (!int8) {
    cmd->add_option("--dtype", dtype, help)->capture_default_str()->check(CLI::IsMember({"f32", "bf16"}));
    return;
  }
  cmd->add_option("--dtype", dtype,
                  help +
                      "; or in int8: the same matrices in blocks of 32 int8 numbers sharing a float32 scale "
                      "(llama.cpp's q8_0 with a float32 scale), 28 % of float32's bytes")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
}

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  cmd->add_option("--set", sets,
                  "override a config key, e.g. --set train.lr=1e-3 (repeatable; "
                  "`moeforge config --markdown` lists the keys)")
      ->type_name("KEY=VALUE");
}

}  // namespace mf::cli
