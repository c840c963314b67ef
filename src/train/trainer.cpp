#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>

#include <filesystem>

#include "core/util.h"
#include "data/shards.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/optim.h"

namespace mf {
namespace fs = std::filesystem;

namespace {

std::string rng_state_hex() {
  auto st = at::detail::getDefaultCPUGenerator().get_state();
  std::string out;
  auto* p = st.data_ptr<uint8_t>();
  for (int64_t i = 0; i < st.numel(); ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

void set_rng_state_hex(const std::string& hex) {
  auto st = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  for (size_t i = 0; i + 1 < hex.size(); i += 2) st[i / 2] = std::stoi(hex.substr(i, 2), nullptr, 16);
  auto gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(st);
}

nlohmann::json losses_json(const std::vector<DomainLoss>& l) {
  nlohmann::json j = nlohmann::json::object();
  for (auto& d : l) j[d.domain] = d.loss;
  return j;
}

struct Trainer {
  const Config& cfg;
  const TrainOptions& opt;
  fs::path run_dir;
  PreparedCorpus corpus;
  TransformerLM model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  int64_t step = 0;  // optimizer steps completed

  Trainer(const Config& c, const TrainOptions& o)
      : cfg(c), opt(o), run_dir(fs::path(c.run.out_dir) / c.run.name), corpus(c.data.dir) {}

  void save(const std::vector<DomainLoss>& last_val) {
    auto name = fmt::format("step_{:08d}", step);
    Config resolved = cfg;
    Metadata meta = {{"format", "pt"},
                     {"moeforge.architecture", "llama"},
                     {"moeforge.version", MOEFORGE_VERSION},
                     {"moeforge.config", to_toml(resolved)},
                     {"moeforge.vocab_size", std::to_string(model->config().vocab_size)},
                     {"moeforge.step", std::to_string(step)}};
    nlohmann::json state = {{"step", step},
                            {"data_position", {{"seed", cfg.train.seed}, {"next_step", step}}},
                            {"rng_cpu", rng_state_hex()},
                            {"val_loss", losses_json(last_val)}};
    write_checkpoint(
        (run_dir / "checkpoints" / name).string(),
        {model_tensors(*model), optimizer_state_tensors(*optimizer, *model), meta, state, corpus.tokenizer_path()});
    prune_checkpoints((run_dir / "checkpoints").string(), cfg.train.keep_checkpoints);
  }

  TrainResult run() {
    if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
    ModelConfig mc = cfg.model;
    mc.vocab_size = corpus.vocab_size();
    model = TransformerLM(mc);
    model->init_weights(static_cast<uint64_t>(cfg.train.seed));
    optimizer = make_optimizer(*model, cfg.train);

    int64_t keep_metrics = -1;
    if (!opt.resume.empty()) {
      auto ck = read_checkpoint(opt.resume);
      load_model_tensors(*model, ck.model);
      load_optimizer_state(*optimizer, *model, ck.optimizer());
      auto st = ck.trainer_state();
      step = st.at("step").get<int64_t>();
      set_rng_state_hex(st.at("rng_cpu").get<std::string>());
      keep_metrics = step;
      spdlog::info("resumed from {} at step {}", ck.dir, step);
    } else if (fs::exists(run_dir / "checkpoints") && !opt.overwrite) {
      throw std::runtime_error(
          fmt::format("run directory '{}' already has checkpoints; pass --resume {} to continue "
                      "or --overwrite to start again",
                      run_dir.string(), run_dir.string()));
    } else if (opt.overwrite) {
      fs::remove_all(run_dir);
    }
    fs::create_directories(run_dir / "checkpoints");
    write_file_atomic((run_dir / "config.toml").string(), to_toml(cfg));
    MetricsLog metrics((run_dir / "metrics.jsonl").string(), keep_metrics);

    const auto& d = cfg.data;
    BatchSampler sampler(corpus, {d.weight_dictionary, d.weight_scripture, d.weight_technical, d.weight_quotations},
                         cfg.train.seq_len, static_cast<uint64_t>(cfg.train.seed));
    auto counts = model->param_counts();
    const auto moe = moe_layers(model->feed_forwards());
    spdlog::info(
        "model: {:.2f}M parameters ({:.2f}M without embeddings, {:.2f}M active per token, {} MoE layers), "
        "{} threads",
        counts.total / 1e6, counts.non_embedding / 1e6, counts.active / 1e6, moe.size(), at::get_num_threads());
    const auto evaluate = [&] {
      return evaluate_domains(model, corpus, "val", cfg.train.seq_len, cfg.eval.windows, cfg.eval.batch_size);
    };

    const int64_t tokens_per_step = cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum;
    const int64_t start_step = step;
    const int64_t end_step = opt.stop_after >= 0 ? std::min(cfg.train.steps, step + opt.stop_after) : cfg.train.steps;
    Progress bar("train", cfg.train.steps);
    std::vector<DomainLoss> val;
    double loss_ema = 0, last_loss = 0, window_time = 0;
    int64_t window_tokens = 0;
    auto t0 = std::chrono::steady_clock::now();
    model->train();
    while (step < end_step) {
      auto ts = std::chrono::steady_clock::now();
      const double lr = lr_at(cfg.train, step);
      set_lr(*optimizer, lr);
      optimizer->zero_grad();
      double loss_sum = 0;
      for (int64_t m = 0; m < cfg.train.grad_accum; ++m) {
        auto batch = sampler.sample(step, m, cfg.train.batch_size);
        AuxLosses aux;
        auto loss = lm_loss(model->forward(batch.inputs, aux), batch.targets);
        loss_sum += loss.item<double>();
        if (auto a = aux.total(); a.defined()) loss = loss + a;
        (loss / static_cast<double>(cfg.train.grad_accum)).backward();
      }
      const double max_norm = cfg.train.grad_clip > 0 ? cfg.train.grad_clip : std::numeric_limits<double>::infinity();
      const double grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
      optimizer->step();
      for (auto& m : moe) m->after_optimizer_step();
      ++step;
      last_loss = loss_sum / static_cast<double>(cfg.train.grad_accum);
      loss_ema = step == start_step + 1 ? last_loss : 0.95 * loss_ema + 0.05 * last_loss;
      window_time += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      window_tokens += tokens_per_step;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (step % cfg.train.log_every == 0 || step == end_step) {
        nlohmann::json rec = {{"step", step},
                              {"loss", last_loss},
                              {"lr", lr},
                              {"grad_norm", grad_norm},
                              {"tokens_per_s", window_tokens / std::max(window_time, 1e-9)},
                              {"elapsed_s", elapsed},
                              {"tokens", step * tokens_per_step}};
        for (auto& m : moe) rec["moe"].push_back(m->stats_json());
        metrics.write(rec);
        if (!stderr_is_tty())
          spdlog::info("step {}/{} loss {:.4f} lr {:.2e} grad_norm {:.3f} {:.0f} tok/s", step, cfg.train.steps,
                       last_loss, lr, grad_norm, window_tokens / std::max(window_time, 1e-9));
        window_time = 0;
        window_tokens = 0;
      }
      bar.update(step, fmt::format("loss {:.3f}", loss_ema));
      const bool last = step == cfg.train.steps;
      if ((cfg.eval.every > 0 && step % cfg.eval.every == 0) || last) {
        val = evaluate();
        nlohmann::json rec = {{"step", step}, {"val_loss", losses_json(val)}, {"val_loss_mean", mean_loss(val)}};
        metrics.write(rec);
        spdlog::info("{}step {} val loss: {}", stderr_is_tty() ? "\n" : "", step, rec["val_loss"].dump());
      }
      if ((cfg.train.ckpt_every > 0 && step % cfg.train.ckpt_every == 0) || step == end_step) save(val);
    }
    bar.finish(fmt::format("loss {:.3f}", loss_ema));
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (val.empty()) val = evaluate();

    const std::string sample = opt.sample ? opt.sample(model, corpus.tokenizer_path()) : "";
    const int64_t steps_run = step - start_step;
    nlohmann::json summary = {{"run", cfg.run.name},
                              {"steps", step},
                              {"steps_this_run", steps_run},
                              {"finished", step == cfg.train.steps},
                              {"parameters", counts.total},
                              {"parameters_non_embedding", counts.non_embedding},
                              {"parameters_active", counts.active},
                              {"tokens_seen", step * tokens_per_step},
                              {"elapsed_s", elapsed},
                              {"tokens_per_s", steps_run * tokens_per_step / std::max(elapsed, 1e-9)},
                              {"final_train_loss", last_loss},
                              {"val_loss", losses_json(val)},
                              {"val_loss_mean", mean_loss(val)},
                              {"unigram_entropy_nats", corpus.manifest().value("unigram_entropy_nats", 0.0)},
                              {"threads", at::get_num_threads()},
                              {"sample", sample},
                              {"checkpoint", latest_checkpoint(run_dir.string())}};
    write_file_atomic((run_dir / "summary.json").string(), summary.dump(2) + "\n");
    return {run_dir.string(), summary};
  }
};

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opt) {
  Trainer t(cfg, opt);
  return t.run();
}

}  // namespace mf
