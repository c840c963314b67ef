// UMoE: REAP saliency of a checkpoint's experts and the prune-clone-perturb surgery.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "methods/umoe/umoe.h"
#include "model/weight_dtype.h"

namespace mf::cli {
namespace {

void add_calibration_options(CLI::App* cmd, CalibrationSource& c, int64_t& batch, bool& layerwise) {
  cmd->add_option("--calib", c.source,
                  "calibration tokens: a domain of the prepared corpus (its train split; e.g. technical), a text "
                  "file (tokenized with the checkpoint's tokenizer) or a .bin token shard")
      ->required();
  cmd->add_option("--samples", c.samples, "calibration windows")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", c.seq_len, "window length (default: train.seq_len)");
  cmd->add_option("--data", c.data_dir, "prepared corpus for a domain source (default: the checkpoint config's)");
  cmd->add_option("--batch", batch, "windows per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--layerwise", layerwise,
                "stream one decoder block at a time from model.safetensors (peak memory ~ one block plus the "
                "calibration hidden states), for models larger than memory");
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

void print_saliency(const std::vector<LayerSaliency>& layers, double fraction) {
  for (auto& s : layers) {
    std::cout << fmt::format("layer {}\n  {:<7} {:>10} {:>8} {:>10}\n", s.layer, "expert", "saliency", "tokens",
                             "mean g");
    for (size_t e = 0; e < s.saliency.size(); ++e)
      std::cout << fmt::format("  {:<7} {:>10.4g} {:>8} {:>10.4f}\n", e, s.saliency[e], s.tokens[e], s.mean_gate[e]);
    const auto low = lowest_saliency(s, fraction);
    std::cout << fmt::format("  lowest-saliency {:.0f} % ({} experts) take {:.1f} % of the routed pairs\n",
                             100 * fraction, low.size(), 100 * pair_share(s, low));
  }
}

// Each command keeps its own options (same flags, separate storage).
struct Calibration {
  CalibrationSource source;
  int64_t batch = 8;
  bool layerwise = false;
  std::string dtype = "f32";
  void add_to(CLI::App* cmd) {
    add_calibration_options(cmd, source, batch, layerwise);
    add_weight_dtype_option(cmd, dtype);
  }
  const CalibrationSource& parsed() {
    source.weights = parse_weight_dtype(dtype);
    return source;
  }
};

void add_saliency(CLI::App& app) {
  static std::string ckpt, out;
  static Calibration calib;
  static double fraction = 0.5;
  auto* sal = app.add_subcommand("saliency",
                                 "REAP saliency of every expert of a checkpoint's MoE layers on calibration tokens "
                                 "(gate-weighted output norm averaged over the tokens routed to it): table, JSON "
                                 "and an SVG heatmap");
  sal->add_option("checkpoint", ckpt, "checkpoint directory, its model.safetensors, or a run directory")->required();
  calib.add_to(sal);
  sal->add_option("--low", fraction, "report the routed share of this lowest-saliency fraction")->capture_default_str();
  sal->add_option("-o,--out", out, "output prefix (default: CHECKPOINT_DIR/saliency_SOURCE -> .json, .svg)");
  sal->callback([] {
    const auto r = write_saliency(ckpt, calib.parsed(), calib.batch, calib.layerwise, out);
    print_saliency(r.layers, fraction);
    if (calib.layerwise)
      std::cout << fmt::format("layer-by-layer: peak RSS {} for a {} model.safetensors (largest block {})\n",
                               mib(r.peak.peak_rss_bytes), mib(r.peak.model_bytes), mib(r.peak.largest_block_bytes));
    else
      std::cout << fmt::format("peak RSS {}\n", mib(r.peak.peak_rss_bytes));
    std::cout << "wrote " << r.prefix << ".json and " << r.prefix << ".svg\n";
  });
}

void add_surgery(CLI::App& app) {
  static std::string ckpt, out;
  static Calibration calib;
  static SurgeryOptions so;
  auto* um = app.add_subcommand(
      "umoe",
      "UMoE surgery before a domain fine-tune: per MoE layer prune the lowest-REAP-saliency experts, refill each freed "
      "slot with a copy of a surviving parent (round-robin, most salient first; MLP weights, router row and bias), "
      "then perturb parent and clone independently; writes a checkpoint of the same architecture (a Hugging Face "
      "directory from one) and umoe_report.json; streamed, one tensor at a time (--layerwise: the calibration too). "
      "Fine-tune with `train --init-from OUT --set data.weight_<other domains>=0`");
  um->add_option("checkpoint", ckpt,
                 "checkpoint directory, its model.safetensors, a run directory, or a Hugging Face model directory")
      ->required();
  um->add_option("-o,--out", out, "output directory (a checkpoint, or a Hugging Face directory from one)")->required();
  calib.add_to(um);
  um->add_option("--prune", so.prune, "fraction of each layer's experts pruned, in (0, 1)")->capture_default_str();
  um->add_option("--sigma", so.sigma, "perturbation: W + sigma * std(W) * N(0, 1)")->capture_default_str();
  um->add_option("--seed", so.seed, "seed of the perturbation noise")->capture_default_str();
  um->add_flag("--one-sided", so.one_sided, "perturb only the clones (the paper's ablation)");
  um->add_flag("--prune-only", so.prune_only, "write the pruned model with fewer experts (REAP's own use)");
  um->callback([] {
    auto r = run_umoe(ckpt, calib.parsed(), so, out, calib.batch, calib.layerwise);
    for (size_t i = 0; i < r.surgery.layers.size(); ++i) {
      const auto& l = r.surgery.layers[i];
      std::cout << fmt::format("layer {}: pruned {} ({:.1f} % of routed pairs); {} {}\n", l.layer,
                               nlohmann::json(l.pruned).dump(), 100 * pair_share(r.saliency[i], l.pruned),
                               so.prune_only ? "kept" : "slot <- parent", nlohmann::json(l.source).dump());
    }
    std::cout << fmt::format("wrote {} and {}\n", out, r.report_path);
    if (!so.prune_only)
      std::cout << fmt::format("fine-tune: moeforge train --init-from {} --set data.weight_<other domain>=0 ...\n",
                               out);
  });
}

}  // namespace

void register_umoe_commands(CLI::App& app) {
  add_saliency(app);
  add_surgery(app);
}

}  // namespace mf::cli
