// Expert-usage pictures and the routing-randomization probe on a trained checkpoint.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <numeric>

#include "analysis/expert_usage.h"
#include "cli/commands.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "methods/intb/intb.h"
#include "methods/intb/probe.h"
#include "methods/unif/diagnostics.h"
#include "methods/unipool/probe.h"
#include "model/weight_dtype.h"

namespace mf::cli {

namespace {

// What every analysis reads: a checkpoint and its held-out data (open_evaluable).
struct Source {
  std::string ckpt, data_dir, split = "val";
  int64_t windows = 32;
  std::string dtype = "f32";
  Evaluable open() const { return open_evaluable(ckpt, windows, data_dir, 0, parse_weight_dtype(dtype)); }
};

std::shared_ptr<Source> add_source(CLI::App* sub, bool with_split, const std::string& windows_help) {
  auto s = std::make_shared<Source>();
  sub->add_option("checkpoint", s->ckpt, "checkpoint directory, its model.safetensors, or a run directory")->required();
  if (with_split) sub->add_option("--split", s->split, "val or test")->check(CLI::IsMember({"val", "test"}));
  sub->add_option("--windows", s->windows, windows_help)->check(CLI::Range(1, 100000));
  sub->add_option("--data", s->data_dir, "corpus or image directory (default: the checkpoint config's)");
  add_weight_dtype_option(sub, s->dtype);
  return s;
}

void add_usage_command(CLI::App& app) {
  auto* usage = app.add_subcommand("usage",
                                   "expert usage per MoE layer on held-out data: layer x expert heatmap, "
                                   "usage per stored expert, globally dead experts (SVG + JSON)");
  const auto usage_src =
      add_source(usage, true, "windows of train.seq_len tokens per domain (classifier: x 16 images)");
  const auto usage_out = std::make_shared<std::string>();
  usage->add_option("--out", *usage_out,
                    "output prefix (default: CHECKPOINT_DIR/usage -> usage_heatmap.svg, usage_hist.svg, "
                    "usage.json)");
  usage->callback([usage_src, usage_out] {
    const auto& out = *usage_out;
    const auto& split = usage_src->split;
    auto model = usage_src->open();
    auto u = measure_expert_usage(model, split);
    if (u.counts.empty()) throw std::runtime_error("the model has no MoE layers");
    const std::string prefix =
        out.empty() ? (std::filesystem::path(read_checkpoint(usage_src->ckpt).dir) / "usage").string() : out;
    auto paths = write_usage_pictures(u, prefix, model.cfg.run.name);
    std::cout << fmt::format("{:<8} {:>6} {:>12} {:>14} {:>10}\n", "block", "group", "experts used", "top share",
                             "pairs");
    for (size_t r = 0; r < u.counts.size(); ++r) {
      const auto& c = u.counts[r];
      const double total = std::accumulate(c.begin(), c.end(), 0.0);
      const auto used = std::count_if(c.begin(), c.end(), [](int64_t v) { return v > 0; });
      std::cout << fmt::format(
          "{:<8} {:>6} {:>5} of {:<4} {:>14.3f} {:>10.0f}\n", u.layers[r], u.group[r], used, c.size(),
          total > 0 ? static_cast<double>(*std::max_element(c.begin(), c.end())) / total : 0.0, total);
    }
    for (size_t r = 0; r < u.token_counts.size(); ++r)
      for (auto& [name, hist] : u.token_counts[r])
        std::cout << fmt::format("block {} {:<17} mean {:.3f}  histogram {}\n", u.layers[r], name, histogram_mean(hist),
                                 nlohmann::json(hist).dump());
    std::cout << fmt::format("stored experts {}, globally dead {}; mean {} loss {:.4f}\n", u.stored_experts(),
                             u.globally_dead(), split, mean_loss(u.loss));
    for (auto& p : paths) std::cout << "wrote " << p << "\n";
  });
}

void add_probe_command(CLI::App& app) {
  auto* probe = app.add_subcommand(
      "probe",
      "routing-randomization probe (UniPool): randomize one MoE layer's expert choice at a time and report "
      "the held-out loss increase per layer and on average");
  struct ProbeCommand {
    std::string layers, out_json;
    std::vector<std::string> modes;
    ProbeOptions options;
  };
  const auto probe_src = add_source(probe, false, "windows per domain (classifier: x 16 images)");
  const auto pc = std::make_shared<ProbeCommand>();
  probe->add_option("--layers", pc->layers, "comma-separated block indices (default: each deep-half MoE layer)");
  probe
      ->add_option("--mode", pc->modes,
                   "own (private experts), pool (the whole shared pool), matched (the layer's "
                   "num_experts most-used experts); default own, or pool and matched for shared pools")
      ->check(CLI::IsMember({"own", "pool", "matched"}));
  probe->add_option("--seed", pc->options.seed, "seed of the random expert draws");
  probe->add_option("--json", pc->out_json, "also write the report as JSON here");
  probe->callback([probe_src, pc] {
    auto model = probe_src->open();
    auto po = pc->options;
    po.modes = pc->modes;
    po.layers.clear();
    std::stringstream ss(pc->layers);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) po.layers.push_back(parse_int(item, "--layers"));
    auto rep = routing_probe(model, po);
    std::cout << rep.markdown();
    if (!pc->out_json.empty()) write_file_atomic(pc->out_json, rep.to_json().dump(2) + "\n");
  });
}

void add_diagnose_command(CLI::App& app) {
  auto* diag = app.add_subcommand(
      "diagnose",
      "UniF-MoE's motivation on a trained top-k MoE: value alignment rho_ij of expert pairs vs their co-activation "
      "(Pearson r), and (top-2 layers) residual demand k_eps under a fitted residual router (SVG + JSON)");
  struct DiagnoseCommand {
    DiagnoseOptions options;
    std::string out;
  };
  const auto diag_src = add_source(diag, false, "windows per domain (classifier: x 16 images)");
  const auto dc = std::make_shared<DiagnoseCommand>();
  auto& dopt = dc->options;
  diag->add_option("--delta", dopt.delta, "alignment threshold on cos(V_i[h], V_j[h])")->capture_default_str();
  diag->add_option("--epsilon", dopt.epsilon, "fidelity tolerance of the residual reconstruction")
      ->capture_default_str();
  diag->add_option("--tokens", dopt.tokens, "tokens captured per MoE layer")->capture_default_str();
  diag->add_option("--fit-steps", dopt.fit_steps, "Adam steps fitting the residual router")->capture_default_str();
  diag->add_option("--split", dopt.split, "val or test")->check(CLI::IsMember({"val", "test"}));
  diag->add_option("--out", dc->out, "output prefix (default: CHECKPOINT_DIR/diagnose)");
  diag->callback([diag_src, dc] {
    const auto& dopt = dc->options;
    auto model = diag_src->open();
    auto d = diagnose_motivation(model, dopt);
    const std::string prefix =
        dc->out.empty() ? (std::filesystem::path(read_checkpoint(diag_src->ckpt).dir) / "diagnose").string() : dc->out;
    std::cout << fmt::format("{:<6} {:>7} {:>22} {:>11} {:>14} {:>18}\n", "block", "pairs", "r(rho, co-activation)",
                             "mean k_eps", "kept top-2 %", "r(rho, pair k_eps)");
    for (auto& l : d)
      std::cout << fmt::format("{:<6} {:>7} {:>22.3f} {:>11.2f} {:>14.1f} {:>18.3f}\n", l.layer, l.pairs.size(),
                               l.pearson, l.mean_k, 100 * l.kept_top2, l.rho_vs_pair_k);
    std::cout << fmt::format(
        "delta {}, epsilon {}; paper (DeiT-S layer 10): r = 0.697, kept top-2 5.7 %, "
        "r(shared ratio, demand) = -0.673\n",
        dopt.delta, dopt.epsilon);
    for (auto& p : write_diagnosis(d, prefix, model.cfg.run.name)) std::cout << "wrote " << p << "\n";
  });
}

void add_intb_probe_command(CLI::App& app) {
  auto* ip = app.add_subcommand(
      "intb-probe",
      "IntBMoE probes: remove one expert basis from every composition of one slot (1/sqrt(E) -> 1/sqrt(E-1)) and "
      "evaluate without retraining, for every slot and basis; pairwise cosine of the block recipes (SVG + JSON)");
  const auto ip_src = add_source(ip, true, "windows per domain (classifier: x 16 images)");
  const auto ip_out = std::make_shared<std::string>();
  ip->add_option("--out", *ip_out, "output prefix (default: CHECKPOINT_DIR/intb_probe)");
  ip->callback([ip_src, ip_out] {
    auto model = ip_src->open();
    auto p = intb_probe(model, ip_src->split);
    std::cout << p.markdown();
    const std::string prefix =
        ip_out->empty() ? (std::filesystem::path(read_checkpoint(ip_src->ckpt).dir) / "intb_probe").string() : *ip_out;
    for (auto& path : write_intb_probe(p, prefix, model.cfg.run.name)) std::cout << "wrote " << path << "\n";
  });
}

void add_intb_bake_command(CLI::App& app) {
  auto* bake = app.add_subcommand("intb-bake",
                                  "write an IntBMoE checkpoint with its K blocks composed once and stored, the "
                                  "codebook, hypernetworks and basis pools dropped (serving computes the same logits)");
  const auto bake_io = std::make_shared<std::pair<std::string, std::string>>();  // checkpoint, output
  bake->add_option("checkpoint", bake_io->first, "checkpoint directory, its model.safetensors, or a run directory")
      ->required();
  bake->add_option("-o,--out", bake_io->second, "output checkpoint directory")->required();
  bake->callback([bake_io] {
    const auto& [ckpt, bake_out] = *bake_io;
    auto r = bake_intb(ckpt, bake_out);
    std::cout << fmt::format("baked {} IntBMoE slots: {} -> {} stored values; wrote {}\n", r.slots, r.parameters_before,
                             r.parameters_after, bake_out);
  });
}

}  // namespace

void register_analysis_commands(CLI::App& app) {
  add_usage_command(app);
  add_probe_command(app);
  add_diagnose_command(app);
  add_intb_probe_command(app);
  add_intb_bake_command(app);
}

}  // namespace mf::cli
