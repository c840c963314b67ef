// LatentMoE tools: `shape` (accounting, near-square shapes, scaling, constant-cost solver),
// `id` (TwoNN profile, two-segment allocation) and `jacobian` (local Jacobian rank).
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "io/model_io.h"
#include "methods/latent/id_report.h"
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

// The shape tools share no option: each subcommand keeps its own.
void add_cost(CLI::App* shape) {
  static int64_t d = 256;
  static std::string layer;
  auto* c = shape->add_subcommand("cost", "P = N l m, C = K l m, V = K l, Q = 2l + N + 3ms; params and MACs per token");
  c->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  c->add_option("layer", layer, "layer shape l,m,N,K,ms (l = 0: experts on the full width)")->required();
  c->callback([] { std::cout << cost_row(d, parse_one(layer, "layer")) << "\n"; });
}

void add_square(CLI::App* shape) {
  static int64_t budget = 0, multiple = 64;
  static double max_dev = 0.4;
  auto* sq = shape->add_subcommand("square", "near-square (l, m) with l*m = budget, nearest to square first");
  sq->add_option("--budget", budget, "per-expert l*m")->required()->check(CLI::PositiveNumber);
  sq->add_option("--multiple", multiple, "hardware multiple for l and m")->check(CLI::PositiveNumber);
  sq->add_option("--max-aspect-dev", max_dev, "largest |l/m - 1| (the paper's best region: 0.4)");
  sq->callback([] {
    auto v = near_square_shapes(budget, multiple, max_dev);
    if (v.empty()) std::cout << "no shape: try a smaller --multiple or a larger --max-aspect-dev\n";
    for (auto& [l, m] : v) std::cout << fmt::format("l={:<6} m={:<6} l/m={:.3f}\n", l, m, double(l) / double(m));
  });
}

void add_scale(CLI::App* shape) {
  static int64_t d = 256, alpha = 2;
  static std::string layer;
  auto* sc =
      shape->add_subcommand("scale", "accuracy-oriented LatentMoE scaling: l = d/alpha, N' = alpha N, K' = alpha K");
  sc->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  sc->add_option("--alpha", alpha, "compression d/l")->check(CLI::PositiveNumber);
  sc->add_option("layer", layer, "uncompressed layer 0,m,N,K,ms")->required();
  sc->callback([] {
    auto s = parse_one(layer, "layer");
    std::cout << "before: " << cost_row(d, s) << "\nafter:  " << cost_row(d, scale_for_accuracy(d, s, alpha)) << "\n";
  });
}

void add_solve(CLI::App* shape) {
  static int64_t d = 256, multiple = 64;
  static std::string reference, targets;
  auto* so = shape->add_subcommand("solve",
                                   "constant-cost allocation: for each target latent width, the layer "
                                   "matching the reference's P, C, V and Q; rounded, with deviations");
  so->add_option("--d", d, "model width d")->check(CLI::PositiveNumber);
  so->add_option("--ref", reference, "reference layer l,m,N,K,ms")->required();
  so->add_option("--latent", targets, "comma-separated target latent widths")->required();
  so->add_option("--multiple", multiple, "round m and ms to this multiple")->check(CLI::PositiveNumber);
  so->callback([] {
    auto ref = parse_one(reference, "--ref");
    std::cout << "reference: " << cost_row(d, ref) << "\n";
    std::stringstream ss(targets);
    for (std::string t; std::getline(ss, t, ',');) {
      auto s = solve_constant_cost(d, ref, std::stoll(t), multiple);
      std::cout << fmt::format("l={}: exact m={:.2f} N={:.2f} K={:.3f} ms={:.2f}\n  rounded {}\n  deviation {}\n", t,
                               s.m, s.N, s.K, s.ms, cost_row(d, s.rounded), s.deviations());
    }
  });
}

void add_id(CLI::App& app) {
  static IdRequest r;
  static std::string reference;
  auto* id = app.add_subcommand("id",
                                "layerwise intrinsic dimension (TwoNN) of a checkpoint's token representations, "
                                "its plot, and the two-segment LatentMoE allocation it suggests");
  id->add_option("checkpoint", r.checkpoint, "checkpoint directory, its model.safetensors, or a run directory")
      ->required();
  id->add_option("--collect", r.collect, "tokens collected from the validation split")->check(CLI::PositiveNumber);
  id->add_option("--keep", r.keep, "tokens kept at random (seeded) for TwoNN")->check(CLI::PositiveNumber);
  id->add_option("--seed", r.seed, "seed of the token draw");
  id->add_option("--data", r.data_dir, "prepared corpus directory (default: the checkpoint config's data.dir)");
  id->add_option("--out", r.prefix, "output prefix (default: CHECKPOINT_DIR/id -> id.json, id.svg)");
  id->add_option("--narrow", r.narrow, "with --wide and --ref: latent width of the shallow (low-ID) segment")
      ->check(CLI::PositiveNumber);
  id->add_option("--wide", r.wide, "latent width of the deep segment")->check(CLI::PositiveNumber);
  id->add_option("--ref", reference, "reference layer l,m,N,K,ms both segments are cost-matched to");
  id->add_option("--multiple", r.multiple, "rounding multiple for the solver")->check(CLI::PositiveNumber);
  id->callback([] {
    if (!reference.empty()) r.reference = parse_one(reference, "--ref");
    const auto out = write_id_report(r);
    const auto& id = out.profile.id;
    for (size_t i = 0; i < id.size(); ++i) std::cout << fmt::format("block {:<3} ID {:.2f}\n", i, id[i]);
    std::cout << (out.split < 0 ? std::string("no two-segment split: the profile never separates a low-ID prefix\n")
                                : fmt::format("two-segment split: blocks 0..{} narrow, {}..{} wide\n", out.split - 1,
                                              out.split, id.size() - 1));
    if (out.allocation) std::cout << out.allocation->summary() << "wrote " << out.prefix << "_allocation.toml\n";
    std::cout << "wrote " << out.prefix << ".json, " << out.prefix << ".svg\n";
  });
}

void add_jacobian(CLI::App& app) {
  static std::string ckpt, data_dir;
  static int64_t samples = 64;
  static double tol = 1e-3;
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

}  // namespace

void register_latent_commands(CLI::App& app) {
  auto* shape = app.add_subcommand("shape",
                                   "LatentMoE shape tools: per-layer cost (P, C, V, Q), near-square expert "
                                   "shapes, accuracy scaling, constant-cost allocation solver");
  shape->require_subcommand(1);
  add_cost(shape);
  add_square(shape);
  add_scale(shape);
  add_solve(shape);
  add_id(app);
  add_jacobian(app);
}

}  // namespace mf::cli
