#include "cli/commands.h"

#include "io/checkpoint.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace mf::cli {

Config resolve_config(const std::string& path, const std::vector<std::string>& sets) {
  Config cfg = path.empty() ? Config{} : load_config(path);
  for (const auto& s : sets) apply_override(cfg, s);
  validate(cfg);
  return cfg;
}

LoadedModel load_model(const std::string& path) {
  LoadedModel l;
  l.cfg = checkpoint_config(path);
  auto ck = read_checkpoint(path);
  l.model = TransformerLM(l.cfg.model);
  load_model_tensors(*l.model, ck.model);
  l.tokenizer = ck.tokenizer_path();
  return l;
}

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  cmd->add_option("--set", sets, "override a config key, e.g. --set train.lr=1e-3 (repeatable; "
                                 "`moeforge config --markdown` lists the keys)")
      ->type_name("KEY=VALUE");
}

}  // namespace mf::cli
