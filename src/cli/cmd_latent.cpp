// LatentMoE tools: `shape` (accounting, near-square shapes, scaling, constant-cost solver),
// `id` (TwoNN profile, two-segment allocation) and `jacobian` (local Jacobian rank).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "analysis/svg_plot.h"
#include "cli/commands.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "methods/latent/intrinsic_dim.h"
#include "methods/latent/jacobian_rank.h"
#include "methods/latent/latent.h"
#include "methods/latent/shape.h"
#include "model/moe_ffn.h"

namespace mf::cli {
namespace {

MoELayerShape parse_one(const std::string& s, const char* what) {
  try {
    auto v = parse_latent_shapes(s);
    if (v.size() == 1) return v[0];
  } catch (const ConfigError&) {}
  throw CLI::ValidationError(what, "expected one layer shape l,m,N,K,ms, got '" + s + "'");
}

std::string cost_row(int64_t d, const MoELayerShape& s) {
  auto c = latent_cost(d, s);
  return fmt::format(
      "l={:<5} m={:<5} N={:<5} K={:<3} ms={:<5} | P={:<10.0f} C={:<9.0f} V={:<6.0f} Q={:<6.0f} | "
      "params {:.3f}M  MACs/token {:.3f}M  aspect l/m {:.2f}",
      s.latent > 0 ? s.latent : d, s.expert_hidden, s.num_experts, s.top_k, s.shared_hidden, c.P, c.C, c.V, c.Q,
      c.params / 1e6, c.macs / 1e6,
      static_cast<double>(s.latent > 0 ? s.latent : d) / static_cast<double>(s.expert_hidden));
}

}  // namespace

void register_latent_commands(CLI::App& app) {
  static int64_t d = 256, multiple = 64, budget = 0, alpha = 2;
  static std::string layer, targets;
  static double max_dev = 0.4;
  auto* shape = app.add_subcommand("shape",
                                   "LatentMoE shape tools: per-layer cost (P, C, V, Q), near-square expert "
                                   "shapes, accuracy scaling, constant-cost allocation solver");
  shape->require_subcommand(1);
  auto* cost =
      shape->add_subcommand("cost", "P = N l m, C = K l m, V = K l, Q = 2l + N + 3ms; params and MACs per token");
  cost->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  cost->add_option("layer", layer, "layer shape l,m,N,K,ms (l = 0: experts on the full width)")->required();
  cost->callback([] { std::cout << cost_row(d, parse_one(layer, "layer")) << "\n"; });

  auto* square = shape->add_subcommand("square", "near-square (l, m) with l*m = budget, nearest to square first");
  square->add_option("--budget", budget, "per-expert l*m")->required()->check(CLI::PositiveNumber);
  square->add_option("--multiple", multiple, "hardware multiple for l and m")->check(CLI::PositiveNumber);
  square->add_option("--max-aspect-dev", max_dev, "largest |l/m - 1| (the paper's best region: 0.4)");
  square->callback([] {
    auto v = near_square_shapes(budget, multiple, max_dev);
    if (v.empty()) std::cout << "no shape: try a smaller --multiple or a larger --max-aspect-dev\n";
    for (auto& [l, m] : v) std::cout << fmt::format("l={:<6} m={:<6} l/m={:.3f}\n", l, m, double(l) / double(m));
  });

  auto* scale =
      shape->add_subcommand("scale", "accuracy-oriented LatentMoE scaling: l = d/alpha, N' = alpha N, K' = alpha K");
  scale->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  scale->add_option("--alpha", alpha, "compression d/l")->check(CLI::PositiveNumber);
  scale->add_option("layer", layer, "uncompressed layer 0,m,N,K,ms")->required();
  scale->callback([] {
    auto s = parse_one(layer, "layer");
    std::cout << "before: " << cost_row(d, s) << "\nafter:  " << cost_row(d, scale_for_accuracy(d, s, alpha)) << "\n";
  });

  auto* solve = shape->add_subcommand("solve",
                                      "constant-cost allocation: for each target latent width, the layer "
                                      "matching the reference's P, C, V and Q; rounded, with deviations");
  solve->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  solve->add_option("--ref", layer, "reference layer l,m,N,K,ms")->required();
  solve->add_option("--latent", targets, "comma-separated target latent widths")->required();
  solve->add_option("--multiple", multiple, "round m and ms to this multiple")->check(CLI::PositiveNumber);
  solve->callback([] {
    auto ref = parse_one(layer, "--ref");
    std::cout << "reference: " << cost_row(d, ref) << "\n";
    std::stringstream ss(targets);
    for (std::string t; std::getline(ss, t, ',');) {
      auto s = solve_constant_cost(d, ref, std::stoll(t), multiple);
      std::cout << fmt::format("l={}: exact m={:.2f} N={:.2f} K={:.3f} ms={:.2f}\n  rounded {}\n  deviation {}\n", t,
                               s.m, s.N, s.K, s.ms, cost_row(d, s.rounded), s.deviations());
    }
  });

  static std::string ckpt, data_dir, out, narrow, wide;
  static int64_t collect = 20000, keep = 5000, samples = 64;
  static uint64_t seed = 0;
  static double tol = 1e-3;
  auto* id = app.add_subcommand("id",
                                "layerwise intrinsic dimension (TwoNN) of a checkpoint's token representations, "
                                "its plot, and the two-segment LatentMoE allocation it suggests");
  id->add_option("checkpoint", ckpt, "checkpoint directory, its model.safetensors, or a run directory")->required();
  id->add_option("--collect", collect, "tokens collected from the validation split")->check(CLI::PositiveNumber);
  id->add_option("--keep", keep, "tokens kept at random (seeded) for TwoNN")->check(CLI::PositiveNumber);
  id->add_option("--seed", seed, "seed of the token draw");
  id->add_option("--data", data_dir, "prepared corpus directory (default: the checkpoint config's data.dir)");
  id->add_option("--out", out, "output prefix (default: CHECKPOINT_DIR/id -> id.json, id.svg)");
  id->add_option("--narrow", narrow, "with --wide and --ref: latent width of the shallow (low-ID) segment");
  id->add_option("--wide", wide, "latent width of the deep segment");
  id->add_option("--ref", layer, "reference layer l,m,N,K,ms both segments are cost-matched to");
  id->add_option("--multiple", multiple, "rounding multiple for the solver");
  id->callback([] {
    auto l = load_model(ckpt);
    PreparedCorpus corpus(data_dir.empty() ? l.cfg.data.dir : data_dir);
    auto p = intrinsic_dimension_profile(l.model, corpus, "val", l.cfg.train.seq_len, collect, keep, seed);
    const std::string prefix = out.empty() ? (std::filesystem::path(read_checkpoint(ckpt).dir) / "id").string() : out;
    Series s{"TwoNN intrinsic dimension", {}, p.id};
    for (size_t i = 0; i < p.id.size(); ++i) s.x.push_back(static_cast<double>(i));
    write_file_atomic(prefix + ".svg", line_chart_svg({s}, {"intrinsic dimension per block — " + l.cfg.run.name,
                                                            "block (output of)", "TwoNN ID"}));
    const int64_t split = two_segment_split(p.id);
    nlohmann::json j = {{"id", p.id},
                        {"tokens_collected", p.tokens_collected},
                        {"tokens_used", p.tokens_used},
                        {"two_segment_split", split}};
    for (size_t i = 0; i < p.id.size(); ++i) std::cout << fmt::format("block {:<3} ID {:.2f}\n", i, p.id[i]);
    std::cout << (split < 0 ? std::string("no two-segment split: the profile never separates a low-ID prefix\n")
                            : fmt::format("two-segment split: blocks 0..{} narrow, {}..{} wide\n", split - 1, split,
                                          p.id.size() - 1));
    if (split > 0 && !narrow.empty() && !wide.empty() && !layer.empty()) {
      auto ref = parse_one(layer, "--ref");
      const auto t = two_segment(l.cfg, split, ref, std::stoll(narrow), std::stoll(wide), multiple);
      write_file_atomic(prefix + "_allocation.toml", to_toml(t.config));
      j["allocation"] = {
          {"latent", t.shapes()}, {"narrow_deviation", t.narrow.deviations()}, {"wide_deviation", t.wide.deviations()}};
      std::cout << t.summary() << "wrote " << prefix << "_allocation.toml\n";
    }
    write_file_atomic(prefix + ".json", j.dump(2) + "\n");
    std::cout << "wrote " << prefix << ".json, " << prefix << ".svg\n";
  });

  auto* jac =
      app.add_subcommand("jacobian", "numerical rank of routed experts' local Jacobians per MoE layer, / min(l, m)");
  jac->add_option("checkpoint", ckpt, "checkpoint directory, its model.safetensors, or a run directory")->required();
  jac->add_option("--samples", samples, "routed (token, expert) pairs per layer")->check(CLI::PositiveNumber);
  jac->add_option("--tol", tol, "singular values above tol * sigma_max count");
  jac->add_option("--data", data_dir, "prepared corpus directory (default: the checkpoint config's data.dir)");
  jac->callback([] {
    auto l = load_model(ckpt);
    PreparedCorpus corpus(data_dir.empty() ? l.cfg.data.dir : data_dir);
    std::cout << fmt::format("{:<7} {:>5} {:>8} {:>10} {:>8} {:>8}\n", "block", "q", "samples", "rank/q", "min", "max");
    for (auto& r : jacobian_ranks(l.model, corpus, "val", l.cfg.train.seq_len, samples, tol))
      std::cout << fmt::format("{:<7} {:>5} {:>8} {:>10.3f} {:>8.3f} {:>8.3f}\n", r.layer, r.q, r.samples, r.mean_rank,
                               r.min_rank, r.max_rank);
  });
}

}  // namespace mf::cli
