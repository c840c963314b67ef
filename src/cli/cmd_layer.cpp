// `moeforge layer names | run`: one FFN slot of a configured model, alone (io/layer_run.h).
#include <fmt/format.h>

#include <torch/torch.h>

#include <iostream>

#include "cli/commands.h"
#include "io/layer_run.h"

namespace mf::cli {

void register_layer_commands(CLI::App& app) {
  auto* layer = app.add_subcommand("layer", "run one configured FFN slot alone on given tensors");
  layer->require_subcommand(1);
  static std::string config, weights, input, out, grad, init_out, example_out;
  static std::vector<std::string> sets;
  static int64_t index = 0;
  auto common = [](CLI::App* cmd) {
    cmd->add_option("--config", config, "model config (TOML); --set overrides apply")->check(CLI::ExistingFile);
    add_set_option(cmd, sets);
    cmd->add_option("--layer", index, "block index N (0-based)")->capture_default_str();
  };

  auto* names = layer->add_subcommand("names",
                                      "the slot's tensor names and shapes (what --weights must hold), optionally "
                                      "written out initialised from train.seed");
  common(names);
  names->add_option("--write", init_out, "write the initialised weights here (safetensors)");
  names->add_option("--write-input", example_out,
                    "write an example input here: \"x\" and \"dy\" [1, 8, d], normal(0, 1) from train.seed");
  names->callback([] {
    auto s = build_layer_slot(resolve_config(config, sets), index);
    std::cout << fmt::format("block {}: model.ffn = \"{}\"\n", index, resolve_config(config, sets).model.ffn);
    for (auto& [name, t] : s.tensors) std::cout << fmt::format("  {:<32} {}\n", name, c10::str(t.sizes()));
    if (!init_out.empty()) {
      save_safetensors(init_out, s.tensors);
      std::cout << "wrote " << init_out << "\n";
    }
    if (!example_out.empty()) {
      const auto cfg = resolve_config(config, sets);
      torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
      save_safetensors(example_out, {{"x", torch::randn({1, 8, cfg.model.d_model})},
                                     {"dy", torch::randn({1, 8, cfg.model.d_model})}});
      std::cout << "wrote " << example_out << "\n";
    }
  });

  auto* run = layer->add_subcommand(
      "run",
      "y = slot(x) for x from --input (tensor \"x\", [..., d]); with --grad (tensor \"dy\") also dx and the gradient "
      "of every weight (\"grad.<name>\"); computes in x's dtype");
  common(run);
  run->add_option("--weights", weights, "the slot's tensors (`moeforge layer names`)")->required();
  run->add_option("--input", input, "safetensors with \"x\"")->required();
  run->add_option("--out", out, "where y (dx, grad.*) go")->required();
  run->add_option("--grad", grad, "safetensors with \"dy\" (same shape as x)");
  run->callback([] {
    auto tensor_in = [](const std::string& path, const char* name) {
      auto st = load_safetensors(path);
      auto it = st.tensors.find(name);
      if (it == st.tensors.end()) throw FormatError(fmt::format("{}: no tensor named \"{}\"", path, name));
      return it->second;
    };
    const auto x = tensor_in(input, "x");
    auto s = build_layer_slot(resolve_config(config, sets), index, x.scalar_type());
    load_layer_weights(s, load_safetensors(weights), weights);
    const auto dy = grad.empty() ? at::Tensor() : tensor_in(grad, "dy");
    auto result = run_layer(s, x, dy);
    save_safetensors(out, result);
    std::cout << fmt::format("block {}: x {} -> y {}; wrote {} tensors to {}\n", index, c10::str(x.sizes()),
                             c10::str(result.front().second.sizes()), result.size(), out);
  });
}

}  // namespace mf::cli
