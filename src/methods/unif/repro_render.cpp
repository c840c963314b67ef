// results.md of `moeforge repro unif` from its results.json alone (see repro.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "data/images.h"
#include "methods/unif/repro.h"
#include "train/repro_report.h"
#include "train/repro_stats.h"

namespace mf {
namespace {
namespace fs = std::filesystem;

const std::vector<std::string> kUnifArms = {"dense",     "top2",       "unif", "top1", "topp", "unif_fixed_alpha",
                                            "unif_top2", "unif_prefix"};
const std::vector<std::string> kAblations = {"unif_fixed_alpha", "unif_top2", "unif_prefix"};

Outcome outcome(const nlohmann::json& arm, const std::string& key) {
  Outcome o;
  if (arm.contains(key)) o.loss = arm[key].get<std::vector<double>>();
  return o;
}

std::string unif_mean_std(const nlohmann::json& arm, const std::string& key, int digits) {
  const auto o = outcome(arm, key);
  if (o.loss.empty()) return "—";
  return fmt::format("{:.{}f} ± {:.{}f}", o.mean(), digits, o.std(), digits);
}

bool unif_vision(const nlohmann::json& js) { return js["setup"]["task"] == "classify"; }

std::string unif_arms_table(const nlohmann::json& js) {
  const bool v = unif_vision(js);
  const auto domain = js["setup"]["domain"].get<std::string>();
  std::string md = v ? "| arm | seeds | params | validation accuracy % | validation loss |"
                     : fmt::format("| arm | seeds | params | {} val loss | other domains' val loss |", domain);
  md +=
      " activated blocks C_B | k | b | slots µs / token | time / top-2 |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : kUnifArms) {
    const auto& a = js["arms"][name];
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", a["label"].get<std::string>(),
                      a["val_loss"].size(), a["params"][0].get<int64_t>(),
                      v ? unif_mean_std(a, "accuracy", 2) : unif_mean_std(a, "val_loss", 4),
                      v ? unif_mean_std(a, "val_loss", 4) : unif_mean_std(a, "others", 4),
                      unif_mean_std(a, "blocks", 2), unif_mean_std(a, "k", 2), unif_mean_std(a, "b", 2),
                      unif_mean_std(a, "us_per_token", 3), unif_mean_std(a, "time_ratio", 3));
  }
  return md + "\n";
}

// The paper's ablation claim is "worse accuracy AND more compute": both lines must hold.
std::string ablation_section(const nlohmann::json& js) {
  std::string md =
      "## The ablations: worse on quality AND compute (the paper's Table IV claim)\n\nEach ablation's call combines "
      "its two lines above: **held** when both held, **did not hold** when either did not hold, otherwise **not "
      "resolved at this scale** (or no verdict, as above).\n\n| ablation | worse quality | more blocks | both |\n"
      "|---|---|---|---|\n";
  for (const auto& name : kAblations) {
    const auto label = js["arms"][name]["label"].get<std::string>();
    std::string quality = "—", compute = "—";
    for (const auto& d : js["directions"]) {
      const auto text = d["text"].get<std::string>();
      if (text.rfind(label + " is worse than", 0) == 0) quality = direction_call(js, d);
      if (text.rfind(label + " activates more blocks", 0) == 0) compute = direction_call(js, d);
    }
    const auto both = quality == "held" && compute == "held"                   ? "held"
                      : quality == "did not hold" || compute == "did not hold" ? "did not hold"
                      : quality == "no verdict" || compute == "no verdict"     ? "no verdict"
                                                                               : "not resolved at this scale";
    md += fmt::format("| {} | {} | {} | **{}** |\n", label, quality, compute, both);
  }
  return md + "\n";
}

std::string motivation_section(const nlohmann::json& js) {
  std::string md =
      "## The paper's motivation, measured on the fine-tuned top-2 arm (seed 0, `moeforge diagnose`)\n\n"
      "| block | r(rho, co-activation) | mean k_eps | residual router keeps the top-2 set | r(rho, pair mean k_eps) |\n"
      "|---|---|---|---|---|\n";
  bool constant = false;  // r undefined: rho the same for every pair of experts
  auto r = [&](const nlohmann::json& v) {
    constant |= v.is_null();
    return v.is_null() ? std::string("undefined") : fmt::format("{:.3f}", v.get<double>());
  };
  std::string rho;
  double most = 0;
  for (const auto& l : js["motivation"]) {
    md += fmt::format("| {} | {} | {:.2f} | {:.1f} % | {} |\n", l["layer"].get<int64_t>(), r(l["pearson"]),
                      l["mean_k"].get<double>(), 100 * l["kept_top2"].get<double>(), r(l["rho_vs_pair_k"]));
    rho += fmt::format("{}block {}: {:.3f} to {:.3f}", rho.empty() ? "" : ", ", l["layer"].get<int64_t>(),
                       l["rho_min"].get<double>(), l["rho_max"].get<double>());
    most = std::max(most, l["rho_max"].get<double>());
  }
  md += "\nPaper (DeiT-S, layer 10): r = 0.697, 5.7 % keep the top-2 set, r(shared ratio, demand) = -0.673.\n";
  if (constant)
    md += fmt::format(
        "\nA correlation is undefined where rho (the share of hidden positions at which two experts' value rows "
        "point the same way, cosine >= delta) does not vary over the pairs of experts ({}){}.\n",
        rho,
        most == 0 ? ": no two experts share a value direction at any position, so the paper's alignment-based "
                    "motivation has nothing to correlate at this scale"
                  : "");
  return md + "\n";
}

void write_unif_pictures(const nlohmann::json& js, const std::string& out) {
  const bool v = unif_vision(js);
  std::vector<Series> quality, time;
  for (const auto& name : kUnifArms) {
    const auto& a = js["arms"][name];
    const auto label = a["label"].get<std::string>();
    const double blocks = outcome(a, "blocks").mean();
    quality.push_back({label, {blocks}, {outcome(a, v ? "accuracy" : "val_loss").mean()}});
    time.push_back({label, {blocks}, {outcome(a, "us_per_token").mean()}});
    quality.back().points = time.back().points = true;
  }
  const auto metric = v ? std::string("validation accuracy %") : js["setup"]["domain"].get<std::string>() + " val loss";
  write_file_atomic((fs::path(out) / "tradeoff.svg").string(),
                    line_chart_svg(quality, {"Fine-tuned arms: " + metric + " vs activated blocks (mean over seeds)",
                                             "activated (expert, block) units per token C_B", metric}));
  write_file_atomic((fs::path(out) / "time_vs_blocks.svg").string(),
                    line_chart_svg(time, {"Upcycled slots re-timed at the trained routing (mean over seeds)",
                                          "activated (expert, block) units per token C_B", "µs per token"}));
}

// "0,2" -> "0 (T-shirt/top) and 2 (Pullover)"
std::string class_list(const std::string& classes) {
  const auto& names = ImageDataset::class_names();
  std::vector<std::string> items;
  for (const auto k : parse_index_list(classes, "classes"))
    items.push_back(k < static_cast<int64_t>(names.size()) ? fmt::format("{} ({})", k, names[k]) : std::to_string(k));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

std::string unif_setup_paragraph(const nlohmann::json& js) {
  const auto& s = js["setup"];
  const bool v = unif_vision(js);
  const auto shift =
      v ? fmt::format(
              "on the Fashion-MNIST images of every class but {0}, then fine-tuned on those classes' images alone "
              "(a class shift: new garments to tell apart, whose output rows the pretraining never trained)",
              class_list(s["classes"].get<std::string>()))
        : fmt::format(
              "on the corpus without `{0}`, then fine-tuned on `{0}` alone (the shift the routing is there to "
              "answer)",
              s["domain"].get<std::string>());
  return fmt::format(
      "A dense {} (d = {}, {} blocks, {} FFN of width {}) pretrained {} steps at peak lr {:g} {}. Blocks {} upcycled "
      "per seed into K = {} experts in B = {} blocks (UniF-MoE: + its shared expert), each arm and a dense control "
      "fine-tuned {} steps of {} {} at peak lr {:g} with the same batches per seed (train.seed = 1000 + s); dense, "
      "top-2 and UniF-MoE over {} seeds, the other arms over the first {}. Quality: {}. Activated blocks per token "
      "on held-out data: UniF-MoE's measured C_B = b + k(B - b); top-k: k·B; top-p: measured k·B. Time: each run's "
      "upcycled slots, as soon as it finished, ran on the hidden states they saw there in turns with the pretrained "
      "backbone's dense slots on the same windows, {} rounds, no grad, {} thread(s); \"time / top-2\" is the ratio "
      "of the two runs' median same-round ratios to the backbone (the backbone is the yardstick between runs timed "
      "at different moments).\n\n",
      v ? "ViT" : "LM", s["d_model"].get<int64_t>(), s["n_layers"].get<int64_t>(), s["ffn"].get<std::string>(),
      s["ffn_hidden"].get<int64_t>(), s["pretrain_steps"].get<int64_t>(), s["pretrain_lr"].get<double>(), shift,
      s["layers"].get<std::string>(), s["experts"].get<int64_t>(), s["blocks"].get<int64_t>(),
      s["finetune_steps"].get<int64_t>(), s["items_per_step"].get<int64_t>(), v ? "images" : "tokens",
      s["finetune_lr"].get<double>(), s["seeds"].get<int64_t>(), s["secondary_seeds"].get<int64_t>(),
      v ? "validation accuracy on the target classes (their images among the last training images, held out)"
        : fmt::format("`{}`'s validation loss ({} windows)", s["domain"].get<std::string>(),
                      s["windows"].get<int64_t>()),
      s["timing_rounds"].get<int64_t>(), s["threads"].get<int64_t>());
}

}  // namespace

std::string render_unif_results(const nlohmann::json& js, const std::string& out_dir) {
  write_unif_pictures(js, out_dir);
  const bool v = unif_vision(js);
  std::string md = fmt::format("# UniF-MoE upcycling in miniature ({})\n\n{}\n\n",
                               v ? "Fashion-MNIST ViT under a class shift" : "language model under a domain shift",
                               results_header(js));
  md += unif_setup_paragraph(js) + unif_arms_table(js) + directions_section(js) + "\n" + ablation_section(js) +
        motivation_section(js);
  md +=
      "Pictures: `tradeoff.svg` (quality vs activated blocks), `time_vs_blocks.svg` (slot time per token vs "
      "activated blocks).\n";
  const auto span = loss_span(js);
  md += limits_section(
      js, {"It can show, at equal fine-tuning steps, recipe and batches, whether UniF-MoE's per-token block budget "
           "keeps top-2's quality with fewer activated blocks, whether those fewer blocks are faster on this CPU at "
           "the routing the arms learned, and whether each ablation costs quality and compute.",
           fmt::format("It cannot show the paper's numbers: DeiT-S and BERT-large on DomainBed and GLUE, against a {} "
                       "of d = {} here. Measured time is CPU time of the two upcycled slots at up to {} tokens per "
                       "call, not a GPU's end-to-end step; a run was timed while the other training part ran, "
                       "the backbone in the same rounds absorbing the machine's load.",
                       v ? "ViT" : "LM", js["setup"]["d_model"].get<int64_t>(),
                       js["setup"]["timing_tokens"].get<int64_t>()),
           v ? fmt::format("The runs' validation losses end at {:.3f}-{:.3f}.", span.lo, span.hi)
             : fmt::format("The runs end at {:.2f}-{:.2f} nats (mean over the four domains) against a unigram "
                           "entropy of {:.2f}.",
                           span.lo, span.hi, span.unigram)});
  return md;
}

}  // namespace mf
