#include "train/train_bench.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/peer.h"
#include "core/runtime.h"
#include "io/model_io.h"
#include "train/trainer.h"

namespace mf {

int64_t tokens_per_item(const Config& c) {
  if (c.model.task != "classify") return c.train.seq_len;
  const int64_t side = c.model.image_size / c.model.patch_size;
  return side * side + 1;  // the patches and the class token
}

double train_flops_per_token(const ModelConfig& m, int64_t seq_len, int64_t active_parameters) {
  const bool lm = m.task != "classify";
  // an LM's embedding table is a lookup; a ViT's patch embedding is a product like any other
  const double n = static_cast<double>(active_parameters - (lm ? m.vocab_size * m.d_model : 0));
  // 12 L T H Dh for full attention (scores and mixing, forward and backward); causal: half
  const double attention = (lm ? 6.0 : 12.0) * static_cast<double>(m.n_layers * seq_len * m.n_heads * m.head_width());
  // a convolution stem's parameters apply at every pixel, not once per token
  const double stem = lm || m.stem_channels == 0
                          ? 0.0
                          : 6.0 * static_cast<double>(m.stem_channels * (9 * m.channels + 1)) *
                                (static_cast<double>(m.image_size * m.image_size) / static_cast<double>(seq_len) - 1.0);
  return 6.0 * n + attention + stem;
}

TrainBenchResult bench_train(Config cfg, int64_t steps, int64_t warmup) {
  // log records at the end of the warm-up and of the timed steps
  for (auto set :
       {fmt::format("train.steps={}", warmup + steps), fmt::format("train.log_every={}", std::gcd(warmup, steps)),
        fmt::format("train.ckpt_every={}", warmup + steps), std::string("eval.every=0"),
        "run.name=bench-train-" + cfg.run.name})
    apply_override(cfg, set);
  validate(cfg);
  TrainBenchResult r;
  r.sgemm_gflops = sgemm_gflops(2048);
  TrainOptions opt;
  opt.overwrite = true;
  const auto result = train(cfg, opt);
  r.run_dir = result.run_dir;
  r.config = checkpoint_config(r.run_dir);  // resolved: the vocabulary comes from the tokenizer
  r.parameters_active = result.summary.at("parameters_active").get<int64_t>();
  // the rate between the log records at `warmup` and at the end (elapsed_s counts from the first step)
  double t0 = -1, t1 = -1;
  std::ifstream f(r.run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("elapsed_s")) continue;
    if (j.at("step") == warmup) t0 = j.at("elapsed_s").get<double>();
    if (j.at("step") == warmup + steps) t1 = j.at("elapsed_s").get<double>();
  }
  if (t0 < 0 || t1 <= t0)
    throw std::runtime_error("bench train: the metrics of " + r.run_dir + " lack the timed steps");
  const int64_t tokens = tokens_per_item(cfg);
  r.tokens_per_s = static_cast<double>(steps * cfg.train.batch_size * tokens * cfg.train.grad_accum) / (t1 - t0);
  r.flops_per_token = train_flops_per_token(r.config.model, tokens, r.parameters_active);
  r.model_gflops = r.flops_per_token * r.tokens_per_s / 1e9;
  return r;
}

namespace {

std::string train_peer_args(const Config& cfg, int64_t steps, int64_t warmup) {
  const auto& m = cfg.model;
  return fmt::format(
      "--d {} --layers {} --heads {} --kv-heads {} --experts {} --top-k {} --expert-hidden {} --vocab {} "
      "--batch {} --seq {} --steps {} --warmup {} --threads {} --lr {} --weight-decay {}",
      m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.moe.num_experts, m.moe.top_k, m.moe.expert_hidden, m.vocab_size,
      cfg.train.batch_size, cfg.train.seq_len, steps, warmup, cfg.train.threads, cfg.train.lr, cfg.train.weight_decay);
}

}  // namespace

TrainBenchReport train_bench_report(const TrainBenchResult& r, const std::string& config_path, const std::string& peer,
                                    int64_t steps, int64_t warmup) {
  const auto& cfg = r.config;
  const auto& m = cfg.model;
  TrainBenchReport out{ResultTable({{"implementation", "implementation", "", -34},
                                    {"tokens_per_s", "tokens/s", "{:.0f}", 10},
                                    {"model_gflops", "model GFLOP/s", "{:.1f}", 14},
                                    {"vs_sgemm", "vs sgemm", "{:.2f}x", 10},
                                    {"ours_vs", "ours vs", "{:.2f}x", 10}}),
                       {{"config", config_path},
                        {"sgemm_gflops", r.sgemm_gflops},
                        {"flops_per_token", r.flops_per_token},
                        {"moeforge", {{"tokens_per_s", r.tokens_per_s}, {"model_gflops", r.model_gflops}}}},
                       ""};
  const auto row = [&](const std::string& name, double tps) {
    const double gf = r.flops_per_token * tps / 1e9;
    out.table.add({{"implementation", name},
                   {"tokens_per_s", tps},
                   {"model_gflops", gf},
                   {"vs_sgemm", gf / r.sgemm_gflops},
                   {"ours_vs", r.tokens_per_s / tps}});
  };
  row("moeforge train", r.tokens_per_s);
  const bool moe_peer = m.ffn == "moe" && m.task != "classify" && !peer.empty();
  for (bool default_env : {false, true}) {
    const std::string name = default_env ? "PyTorch (default environment)" : "PyTorch (our environment)";
    auto res = moe_peer ? run_peer(peer, train_peer_args(cfg, steps, warmup), default_env)
                        : nlohmann::json{{"skipped", peer.empty() ? "--peer ''" : "the peer is an MoE LM"}};
    out.json[default_env ? "pytorch_default" : "pytorch_tuned"] = res;
    if (res.contains("tokens_per_s"))
      row(name, res["tokens_per_s"].get<double>());
    else
      out.table.add({{"implementation", name}, {"note", res["skipped"].get<std::string>()}});
  }
  out.json["rows"] = out.table.json();
  out.note = fmt::format(
      "{}: {:.1f} MFLOP per token (6 x {:.2f} M active non-embedding parameters + attention), {} tokens per "
      "{}, sgemm {:.1f} GFLOP/s, {} threads, {} timed steps after {}\n",
      config_path, r.flops_per_token / 1e6,
      static_cast<double>(r.parameters_active - (m.task == "classify" ? 0 : m.vocab_size * m.d_model)) / 1e6,
      tokens_per_item(cfg), m.task == "classify" ? "image" : "window", r.sgemm_gflops, cfg.train.threads, steps,
      warmup);
  return out;
}

}  // namespace mf
