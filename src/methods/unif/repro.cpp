#include "methods/unif/repro.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "data/images.h"
#include "data/prepare.h"
#include "io/model_io.h"
#include "io/upcycle.h"
#include "methods/unif/diagnostics.h"
#include "methods/unif/unif.h"
#include "train/evaluable.h"
#include "train/evaluate.h"

namespace mf {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Arm {
  std::string name, label, method;  // method: "" = the dense control
  std::vector<std::string> sets;
};

std::vector<Arm> arms(const UniFReproOptions& o) {
  return {{"dense", "dense (fine-tuned as long)", "", {}},
          {"top2", "top-2 MoE", "topk", {}},
          {"top1", "top-1 MoE", "topk", {"model.moe.top_k=1"}},
          {"topp", fmt::format("top-p MoE (p = {})", o.top_p), "topp", {}},
          {"unif", "UniF-MoE", "unif", {}},
          {"unif_fixed_alpha", "UniF-MoE, fixed alpha = 0.4", "unif", {"model.moe.unif.fixed_alpha=0.4"}},
          {"unif_top2", "UniF-MoE, top-2 residual experts", "unif", {"model.moe.unif.residual_top_k=2"}},
          {"unif_prefix", "UniF-MoE, prefix blocks", "unif", {"model.moe.unif.block_select=prefix"}}};
}

// Times one FFN slot's forward passes (CPU: the call returns when the work is done).
class TimedSlot : public FeedForward {
 public:
  TimedSlot(std::shared_ptr<FeedForward> inner, double* seconds) : inner_(std::move(inner)), seconds_(seconds) {}
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override {
    const auto t0 = Clock::now();
    auto y = inner_->forward(x, aux);
    *seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    return y;
  }

 private:
  std::shared_ptr<FeedForward> inner_;
  double* seconds_;
};

struct Measured {
  double accuracy = 0, loss = 0;    // LM: accuracy unused, loss = mean validation loss over domains
  double ms_per_unit = 0;           // the upcycled blocks' FFN slots, inference, per 1,000 images / 1 M tokens
  double blocks = 0, k = 0, b = 0;  // per token, mean over the upcycled blocks (top-k: k * B)
};

// Wraps the upcycled blocks' FFN slots in timers; returns the wrapped slots.
std::vector<std::shared_ptr<FeedForward>> time_slots(std::vector<std::shared_ptr<FeedForward>*> slots,
                                                     double* seconds) {
  std::vector<std::shared_ptr<FeedForward>> kept;
  for (auto* slot : slots) {
    kept.push_back(*slot);
    *slot = std::make_shared<TimedSlot>(kept.back(), seconds);
  }
  return kept;
}

// Quality (vision: test accuracy and loss; LM: validation loss), the upcycled slots' inference
// time and their measured block accounting. `items`: images (vision) or LM windows per domain;
// 0 = the whole split.
Measured measure(const std::string& dir, const std::vector<int64_t>& layers, int64_t B, int64_t items) {
  double seconds = 0, blocks = 0, k = 0, b = 0, batches = 0, count = 0;
  std::vector<std::shared_ptr<MoEFeedForward>> moe;
  const auto after_batch = [&] {
    for (auto& m : moe) {
      const auto s = m->last_stats();
      const bool unif = !s.counts.empty();
      blocks += unif ? s.mean_units_per_token : s.mean_units_per_token * static_cast<double>(B);
      k += unif ? s.counts[1].mean : s.mean_units_per_token;
      b += unif ? s.counts[0].mean : 0;
    }
    batches += static_cast<double>(moe.size());
  };
  Measured r;
  if (checkpoint_config(dir).model.task == "classify") {
    auto l = load_classifier(dir);
    ImageDataset data(l.cfg.data.images_dir, l.cfg.data.val_images);
    std::vector<std::shared_ptr<FeedForward>*> slots;
    for (auto i : layers) slots.push_back(&l.model->blocks[static_cast<size_t>(i)]->mlp);
    moe = moe_layers(time_slots(slots, &seconds));
    auto ev = evaluate_classifier(*l.model, data, "test", items, 500, false, after_batch);
    r.accuracy = ev.accuracy, r.loss = ev.loss, count = static_cast<double>(ev.count) / 1000;
  } else {
    auto l = load_model(dir);
    std::vector<std::shared_ptr<FeedForward>*> slots;
    for (auto i : layers) slots.push_back(&l.model->model->blocks[static_cast<size_t>(i)]->mlp);
    moe = moe_layers(time_slots(slots, &seconds));
    const auto corpus = corpus_for_model(l.cfg.data.dir, l.cfg.model.vocab_size);
    if (!corpus) throw std::runtime_error("repro unif: no prepared corpus at " + l.cfg.data.dir);
    const auto losses = evaluate_domains(l.model, *corpus, "val", l.cfg.train.seq_len, items, 16, after_batch);
    r.loss = mean_loss(losses);
    for (const auto& d : losses) count += static_cast<double>(d.tokens) / 1e6;
  }
  r.ms_per_unit = 1e3 * seconds / count;  // ms per 1,000 images or per million tokens
  if (batches > 0) r.blocks = blocks / batches, r.k = k / batches, r.b = b / batches;
  if (moe.empty()) r.blocks = static_cast<double>(B), r.k = 1;  // the dense FFN: one whole expert
  return r;
}

int64_t total_parameters(const std::string& dir) {
  if (checkpoint_config(dir).model.task == "classify") return load_classifier(dir).model->param_counts().total;
  return load_model(dir).model->param_counts().total;
}

}  // namespace

ReproResult unif_repro(ReproArgs args, const UniFReproOptions& opt) {
  const auto t0 = Clock::now();
  const bool vision = load_config(args.config).model.task == "classify";
  std::vector<std::string> quick = {"model.d_model=16",     "model.n_layers=4",    "model.n_heads=2",
                                    "model.n_kv_heads=2",   "model.ffn_hidden=32", "train.steps=10",
                                    "train.warmup_steps=2", "eval.every=0"};
  for (auto set : vision ? std::vector<std::string>{"train.batch_size=16", "data.val_images=500"}
                         : std::vector<std::string>{"train.batch_size=4", "train.seq_len=32", "eval.windows=2"})
    quick.push_back(set);
  auto base = repro_base_config(args, quick);
  if (vision ? base.model.ffn != "gelu" : base.model.ffn != "swiglu" && base.model.ffn != "gelu")
    throw ConfigError(
        "repro unif: the base config must be a dense model to upcycle: a ViT with model.ffn = \"gelu\" or an LM "
        "with model.ffn = \"swiglu\" or \"gelu\"");
  const auto layers = parse_block_list(opt.layers, "repro unif --layers");
  const int64_t finetune = args.quick ? 4 : opt.finetune_steps;
  const int64_t items = vision ? (args.quick ? 1000 : 0) : base.eval.windows;
  base.run.name = "unif-dense-pretrain";
  spdlog::info("repro unif: pretraining the dense backbone ({} steps)", base.train.steps);
  const auto dense_dir = run_variant(base);
  double train_seconds = run_seconds(dense_dir);  // from each run's summary, so reused runs count too
  const auto all = arms(opt);
  std::map<std::string, std::vector<Measured>> res;
  std::map<std::string, int64_t> params;
  for (int64_t s = 0; s < args.seeds; ++s) {
    for (const auto& arm : all) {
      const auto name = fmt::format("unif-{}-s{}", arm.name, s);
      Config cfg = checkpoint_config(dense_dir);
      std::string init = dense_dir;
      if (!arm.method.empty()) {
        UpcycleOptions u;
        u.layers = layers;
        u.method = arm.method;
        u.experts = opt.experts;
        u.blocks = opt.blocks;
        u.top_p = opt.top_p;
        u.seed = static_cast<uint64_t>(s);
        u.sets = arm.sets;
        init = (fs::path(base.run.out_dir) / "unif-upcycled" / name).string();
        cfg = upcycle(dense_dir, init, u).config;
      }
      apply_finetune(cfg, finetune, opt.finetune_lr, s, name);
      spdlog::info("repro unif: {} seed {}", arm.label, s);
      const auto dir = run_variant(cfg, init);
      train_seconds += run_seconds(dir);
      res[arm.name].push_back(measure(dir, layers, opt.blocks, items));
      if (s == 0) params[arm.name] = total_parameters(dir);
    }
  }
  const double minutes = std::chrono::duration<double>(Clock::now() - t0).count() / 60;
  auto field = [&](const std::string& arm, double Measured::*f) {
    std::vector<double> v;
    for (auto& m : res[arm]) v.push_back(m.*f);
    return v;
  };
  auto mean_std = [&](const std::string& arm, double Measured::*f, double scale, int digits) {
    Outcome o;
    o.loss = field(arm, f);
    return fmt::format("{:.{}f} ± {:.{}f}", scale * o.mean(), digits, scale * o.std(), digits);
  };
  const auto& m = base.model;
  const std::string per = vision ? "ms / 1k images" : "ms / M tokens";
  std::string md = fmt::format(
      "# UniF-MoE upcycling in miniature ({})\n\nProduced by `{} --finetune-steps {} --experts {} "
      "--blocks {} --layers {}`. Dense {} (d = {}, {} blocks, {} FFN width {}) pretrained for {} steps, blocks {} "
      "upcycled with K = {} experts of width {} in B = {} blocks (UniF-MoE: + its shared expert), every arm and a "
      "dense control fine-tuned {} steps (lr {}, same batches per seed), {} seed(s). {}. "
      "Activated blocks per token: UniF-MoE's measured C_B = b + k(B - b); top-k: k·B; top-p: measured k·B. "
      "Inference: the two upcycled FFN slots only, no grad, {}. Training "
      "{:.1f} min summed over the runs (their summaries), this invocation {:.1f} min, {} threads.\n\n",
      vision ? "Fashion-MNIST ViT" : "language model", args.command_line("unif"), opt.finetune_steps, opt.experts,
      opt.blocks, opt.layers, vision ? "ViT" : "LM", m.d_model, m.n_layers, m.ffn, m.ffn_hidden, base.train.steps,
      opt.layers, opt.experts, m.ffn_hidden, opt.blocks, finetune, opt.finetune_lr, args.seeds,
      vision ? fmt::format("Test split ({})", args.quick ? "its first 1,000 images" : "10,000 images")
             : fmt::format("Validation loss: mean over the corpus domains, {} windows of {} tokens each", items,
                           base.train.seq_len),
      vision ? "batches of 500, " + per : "batches of 16 windows, " + per, train_seconds / 60, minutes,
      base.train.threads);
  md += vision ? "| arm | params | test accuracy % | test loss | activated blocks | k | b | slot " + per +
                     " |\n"
                     "|---|---|---|---|---|---|---|---|\n"
               : "| arm | params | validation loss | activated blocks | k | b | slot " + per +
                     " |\n"
                     "|---|---|---|---|---|---|---|\n";
  nlohmann::json js = {{"minutes", minutes},
                       {"training_minutes", train_seconds / 60},
                       {"seeds", args.seeds},
                       {"task", vision ? "classify" : "lm"}};
  for (const auto& arm : all) {
    const auto quality =
        vision ? mean_std(arm.name, &Measured::accuracy, 100, 2) + " | " + mean_std(arm.name, &Measured::loss, 1, 4)
               : mean_std(arm.name, &Measured::loss, 1, 4);
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", arm.label, params[arm.name], quality,
                      mean_std(arm.name, &Measured::blocks, 1, 2), mean_std(arm.name, &Measured::k, 1, 2),
                      mean_std(arm.name, &Measured::b, 1, 2), mean_std(arm.name, &Measured::ms_per_unit, 1, 1));
    js["arms"][arm.name] = {
        {"label", arm.label},
        {"accuracy", field(arm.name, &Measured::accuracy)},
        {"loss", field(arm.name, &Measured::loss)},
        {"blocks", field(arm.name, &Measured::blocks)},
        {"k", field(arm.name, &Measured::k)},
        {"b", field(arm.name, &Measured::b)},
        {vision ? "ms_per_1k_images" : "ms_per_million_tokens", field(arm.name, &Measured::ms_per_unit)}};
  }
  md += "\n## The paper's directions at this scale (paired by seed: difference ± standard error)\n\n";
  auto direction = [&](const std::string& text, const PairedDifference& d, bool want_positive, const char* unit,
                       double scale) { return report_direction(md, js, text, d, want_positive, unit, scale, 3); };
  auto diff = [&](const std::string& a, const std::string& b, double Measured::*f) {
    return paired_difference(field(a, f), field(b, f));
  };
  // "a is better than b" on quality: accuracy up (vision) or validation loss down (LM)
  auto better = [&](const std::string& text, const std::string& a, const std::string& b) {
    if (vision)
      return direction(text + " (accuracy difference)", diff(a, b, &Measured::accuracy), true, " points", 100);
    return report_direction(md, js, text + " (validation loss difference: the other arm's minus UniF-MoE's)",
                            diff(b, a, &Measured::loss), true, " nats", 1, 4);
  };
  better("UniF-MoE is better than top-2", "unif", "top2");
  direction("UniF-MoE activates fewer blocks than top-2", diff("unif", "top2", &Measured::blocks), false, " blocks", 1);
  direction("UniF-MoE's MoE slots run faster than top-2's", diff("unif", "top2", &Measured::ms_per_unit), false,
            vision ? " ms / 1k images" : " ms / M tokens", 1);
  for (std::string a : {"unif_fixed_alpha", "unif_top2", "unif_prefix"}) {
    const auto label = std::find_if(all.begin(), all.end(), [&](auto& x) { return x.name == a; })->label;
    auto q = better(label + " is worse than UniF-MoE", "unif", a);
    auto c = direction(label + " activates more blocks than UniF-MoE", diff(a, "unif", &Measured::blocks), true,
                       " blocks", 1);
    md += fmt::format("  - worse on quality or compute: **{}**\n", q == "held" || c == "held" ? "held"
                                                                   : q == "did not hold" && c == "did not hold"
                                                                       ? "did not hold"
                                                                       : "not resolved at this scale");
  }
  // pictures: quality against compute per arm, and the paper's motivation measured on the top-2 arm
  std::vector<Series> points;
  for (const auto& arm : all) {
    Outcome quality, blocks;
    quality.loss = field(arm.name, vision ? &Measured::accuracy : &Measured::loss);
    blocks.loss = field(arm.name, &Measured::blocks);
    points.push_back({arm.label, {blocks.mean()}, {(vision ? 100 : 1) * quality.mean()}});
    points.back().points = true;
  }
  write_file_atomic(
      (fs::path(args.out) / "tradeoff.svg").string(),
      line_chart_svg(points,
                     {vision ? "Fine-tuned arms: test accuracy vs activated blocks per token (mean over seeds)"
                             : "Fine-tuned arms: validation loss vs activated blocks per token (mean over seeds)",
                      "activated (expert, block) units per token", vision ? "test accuracy %" : "validation loss"}));
  DiagnoseOptions dopt;
  dopt.split = "test";
  dopt.tokens = args.quick ? 200 : 4096;
  dopt.fit_steps = args.quick ? 5 : 300;
  const auto top2_dir = (fs::path(base.run.out_dir) / "unif-top2-s0").string();
  const auto diag = diagnose_motivation(open_evaluable(top2_dir, args.quick ? 4 : 64), dopt);
  write_diagnosis(diag, (fs::path(args.out) / "top2_diagnose").string(), "upcycled top-2 (seed 0)");
  md +=
      "\n## The paper's motivation, measured on the fine-tuned top-2 arm (seed 0, `moeforge diagnose`)\n\n"
      "| block | r(rho, co-activation) | mean k_eps | residual router keeps the top-2 set | r(rho, pair mean k_eps) |\n"
      "|---|---|---|---|---|\n";
  for (auto& l : diag)
    md += fmt::format("| {} | {:.3f} | {:.2f} | {:.1f} % | {:.3f} |\n", l.layer, l.pearson, l.mean_k, 100 * l.kept_top2,
                      l.rho_vs_pair_k);
  md +=
      "\nPaper (DeiT-S, layer 10): r = 0.697, 5.7 % keep the top-2 set, r(shared ratio, demand) = -0.673. "
      "Pictures: `tradeoff.svg`, `top2_diagnose_alignment.svg`, `top2_diagnose_demand.svg`.\n";
  return {args.out, md, js};
}

}  // namespace mf
