// `moeforge layer names | run`: one FFN slot of a configured model, alone (io/layer_run.h).
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "io/layer_run.h"

namespace mf::cli {
namespace {

// Which slot: the config, its overrides and the block index (each subcommand its own).
struct SlotArgs {
  std::string config;
  std::vector<std::string> sets;
  int64_t index = 0;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--config", config, "model config (TOML); --set overrides apply")->check(CLI::ExistingFile);
    add_set_option(cmd, sets);
    cmd->add_option("--layer", index, "block index N (0-based)")->capture_default_str();
  }
};

void add_layer_names(CLI::App* layer) {
  static SlotArgs slot;
  static std::string init_out, example_out;
  auto* names = layer->add_subcommand("names",
                                      "the slot's tensor names and shapes (what --weights must hold), optionally "
                                      "written out initialised from train.seed");
  slot.add_to(names);
  names->add_option("--write", init_out, "write the initialised weights here (safetensors)");
  names->add_option("--write-input", example_out,
                    "write an example input here: \"x\" and \"dy\" [1, 8, d], normal(0, 1) from train.seed");
  names->callback([] {
    const auto cfg = resolve_config(slot.config, slot.sets);
    auto s = build_layer_slot(cfg, slot.index);
    std::cout << fmt::format("block {}: model.ffn = \"{}\"\n", slot.index, cfg.model.ffn);
    for (auto& [name, t] : s.tensors) std::cout << fmt::format("  {:<32} {}\n", name, c10::str(t.sizes()));
    if (!init_out.empty()) {
      save_safetensors(init_out, s.tensors);
      std::cout << "wrote " << init_out << "\n";
    }
    if (!example_out.empty()) {
      save_safetensors(example_out, example_layer_input(cfg));
      std::cout << "wrote " << example_out << "\n";
    }
  });
}

void add_layer_run(CLI::App* layer) {
  static SlotArgs slot;
  static std::string weights, input, out, grad;
  auto* run = layer->add_subcommand(
      "run",
      "y = slot(x) for x from --input (tensor \"x\", [..., d]); with --grad (tensor \"dy\") also dx and the gradient "
      "of every weight (\"grad.<name>\"); computes in x's dtype");
  slot.add_to(run);
  run->add_option("--weights", weights, "the slot's tensors (`moeforge layer names`)")->required();
  run->add_option("--input", input, "safetensors with \"x\"")->required();
  run->add_option("--out", out, "where y (dx, grad.*) go")->required();
  run->add_option("--grad", grad, "safetensors with \"dy\" (same shape as x)");
  run->callback([] {
    const auto x = tensor_from(input, "x");
    auto s = build_layer_slot(resolve_config(slot.config, slot.sets), slot.index, x.scalar_type());
    load_layer_weights(s, load_safetensors(weights), weights);
    auto result = run_layer(s, x, grad.empty() ? at::Tensor() : tensor_from(grad, "dy"));
    save_safetensors(out, result);
    std::cout << fmt::format("block {}: x {} -> y {}; wrote {} tensors to {}\n", slot.index, c10::str(x.sizes()),
                             c10::str(result.front().second.sizes()), result.size(), out);
  });
}

}  // namespace

void register_layer_commands(CLI::App& app) {
  auto* layer = app.add_subcommand("layer", "run one configured FFN slot alone on given tensors");
  layer->require_subcommand(1);
  add_layer_names(layer);
  add_layer_run(layer);
}

}  // namespace mf::cli
