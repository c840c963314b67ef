#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "core/rank_state.h"
#include "core/runtime.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "model/moe_ffn.h"
#include "moe/dispatch.h"
#include "train/across_ranks.h"
#include "train/finite.h"
#include "train/grad_overlap.h"
#include "train/metrics.h"
#include "train/optim.h"
#include "train/parallel.h"
#include "train/profile.h"
#include "train/task.h"

namespace mf {
namespace fs = std::filesystem;

namespace {

// What the run report shows of where a run ran, written before the first step.
nlohmann::json environment_json(const Config& cfg, const ParamCounts& counts) {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  return {{"started_utc", fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", utc.tm_year + 1900, utc.tm_mon + 1,
                                      utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec)},
          {"host", host},
          {"cores", std::max(1u, std::thread::hardware_concurrency())},
          {"threads", at::get_num_threads()},
          {"moeforge", MOEFORGE_VERSION},
          {"commit", build_commit()},
          {"libtorch", TORCH_VERSION},
          {"runtime", runtime_summary()},
          {"parameters", counts.total},
          {"parameters_active", counts.active},
          {"steps_planned", cfg.train.steps}};
}

std::string rng_state_hex() {
  auto st = at::detail::getDefaultCPUGenerator().get_state();
  std::string out;
  auto* p = st.data_ptr<uint8_t>();
  for (int64_t i = 0; i < st.numel(); ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

void set_rng_state_hex(const std::string& hex) {
  if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw FormatError("trainer_state.json: rng_cpu is not a lowercase hex string");
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
  std::unique_ptr<Task> task;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  int64_t step = 0;                               // optimizer steps completed
  Distributed dist;                               // what opt.distribute did (nothing without it)
  std::unordered_set<std::string> sharded_names;  // of dist.sharded and their AdamW moments

  Trainer(const Config& c, const TrainOptions& o)
      : cfg(c), opt(o), run_dir(fs::path(c.run.out_dir) / c.run.name), task(make_task(c)) {}

  // Stops the run: the metrics line says where, and nothing non-finite reaches a checkpoint.
  [[noreturn]] void diverged(MetricsLog& metrics, const std::string& what, const std::string& tensor,
                             bool skippable = false, int64_t at_step = -1) {
    if (at_step < 0) at_step = step;
    metrics.write({{"step", at_step}, {"diverged", what}, {"tensor", tensor}});
    const auto latest = latest_checkpoint(run_dir.string());
    throw DivergenceError(
        fmt::format("step {}: {}; first non-finite tensor: '{}'. No checkpoint holds it; the latest good one is {}. "
                    "Lower train.lr, raise train.adam_eps or model.norm_eps{}",
                    at_step, what, tensor, latest.empty() ? "none (no checkpoint yet)" : latest,
                    skippable ? ", or let train.skip_nonfinite skip such steps" : ""));
  }

  // Rank 0 writes the checkpoint, or with train.shard_checkpoints every rank writes its shard.
  void save(const Evaluation& last_val, MetricsLog& metrics) {
    DataParallel* par = opt.parallel;
    const bool sharded = par && par->world() > 1 && cfg.train.shard_checkpoints;
    const bool split = !dist.sharded.empty();  // expert slices to gather first, on every rank
    if (par && par->rank() != 0 && !sharded && !split) return;
    auto& module = task->module();
    auto state = optimizer_state_tensors(*optimizer, module);
    auto tensors = model_tensors(module);
    if (auto bad = first_nonfinite(tensors); !bad.empty()) diverged(metrics, "non-finite weights", bad);
    if (auto bad = first_nonfinite(state); !bad.empty()) diverged(metrics, "non-finite optimizer state", bad);
    if (split) {
      gather_for_writing(*par, tensors, sharded_names, !sharded);
      gather_for_writing(*par, state, sharded_names, !sharded);
      if (par->rank() != 0 && !sharded) return;
    }
    auto name = fmt::format("step_{:08d}", step);
    Config resolved = cfg;
    Metadata meta = task->checkpoint_metadata();
    meta.insert({{"format", "pt"},
                 {"moeforge.version", MOEFORGE_VERSION},
                 {"moeforge.config", to_toml(resolved)},
                 {"moeforge.step", std::to_string(step)}});
    nlohmann::json trainer_state = {{"step", step},
                                    {"data_position", {{"seed", cfg.train.seed}, {"next_step", step}}},
                                    {"rng_cpu", rng_state_hex()},
                                    {"val_loss", losses_json(last_val.losses)}};
    const auto dir = (run_dir / "checkpoints" / name).string();
    const CheckpointContents contents{tensors, state, meta, trainer_state, task->tokenizer_path()};
    if (!sharded) {
      write_checkpoint(dir, contents);
    } else {
      if (par->rank() == 0) begin_sharded_checkpoint(dir);
      par->barrier();
      write_checkpoint_shard(dir, contents, par->rank(), par->world());
      par->barrier();
      if (par->rank() != 0) return;
      finish_sharded_checkpoint(dir, contents, par->world());
    }
    prune_checkpoints((run_dir / "checkpoints").string(), cfg.train.keep_checkpoints);
  }

  // The run directory before the first step (rank 0 only): leftovers of an interrupted write
  // removed; returns whether to resume from opt.resume (false: a fresh run, fresh directory).
  bool prepare_run_dir() {
    const auto ckpt_root = (run_dir / "checkpoints").string();
    if (const int n = clean_checkpoint_leftovers(ckpt_root); n > 0)
      spdlog::warn("removed {} unfinished checkpoint write(s) or removal(s) left in {} by an interrupted run", n,
                   ckpt_root);
    // A run killed before its first checkpoint has nothing to resume or protect: it starts again.
    const bool nothing_saved = fs::exists(run_dir / "checkpoints") && latest_checkpoint(run_dir.string()).empty();
    bool resume = false;
    if (nothing_saved && (opt.resume.empty() || (fs::exists(opt.resume) && fs::equivalent(opt.resume, run_dir)))) {
      spdlog::warn("run directory '{}' has no checkpoint (the run stopped before its first one); starting from step 0",
                   run_dir.string());
    } else if (!opt.resume.empty()) {
      resume = true;
    } else if (fs::exists(run_dir / "checkpoints") && !opt.overwrite) {
      throw std::runtime_error(
          fmt::format("run directory '{}' already has checkpoints; pass --resume {} to continue "
                      "or --overwrite to start again",
                      run_dir.string(), run_dir.string()));
    } else if (opt.overwrite) {
      fs::remove_all(run_dir);
    }
    return resume;
  }

  // ---- the run, in phases ----
  DataParallel* par = opt.parallel;
  bool lead = !par || par->rank() == 0;  // rank 0 owns the run directory, metrics and checkpoints
  bool together = false;                 // sharded experts: every forward is a collective, all ranks evaluate
  int64_t start_step = 0, end_step = 0, items_per_step = 0, state_bytes = 0;
  ParamCounts counts;  // of the whole model, before any sharding
  std::vector<at::Tensor> replicated;
  std::vector<std::shared_ptr<MoEFeedForward>> moe;
  std::vector<ReportsRouting*> routing;
  std::vector<at::Tensor> rank_state;  // buffers averaged over ranks after each round of micro-batches
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<StepProfiler> profiler;
  std::unique_ptr<GradOverlap> overlap;  // gradient sums started during each step's last backward
  Evaluation val;
  double loss_ema = 0, last_loss = 0, window_time = 0;
  int64_t skipped = 0, window_items = 0;  // skipped: steps without an update (non-finite loss or gradient)
  std::chrono::steady_clock::time_point t0;

  struct Step {
    double lr = 0, grad_norm = 0;
  };

  TrainResult run() {
    const int64_t keep_metrics = start();
    const std::string parallel = distribute();
    open_run(keep_metrics, parallel);
    Progress bar("train", cfg.train.steps);
    prepare_loop();
    while (step < end_step) {
      const auto ts = std::chrono::steady_clock::now();
      const Step s = train_step();
      loss_ema = step == start_step + 1 ? last_loss : 0.95 * loss_ema + 0.05 * last_loss;
      window_time += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      window_items += items_per_step;
      if (step % cfg.train.log_every == 0 || step == end_step) log(s);
      if (lead) bar.update(step, fmt::format("loss {:.3f}", loss_ema));
      const bool last = step == cfg.train.steps;
      if ((lead || together) && ((cfg.eval.every > 0 && step % cfg.eval.every == 0) || last)) evaluate();
      if ((cfg.train.ckpt_every > 0 && step % cfg.train.ckpt_every == 0) || step == end_step) save(val, *metrics);
    }
    if (lead) bar.finish(fmt::format("loss {:.3f}", loss_ema));
    return finish();
  }

  // Threads, weights and optimizer; rank 0 prepares the run directory; then the resumed or
  // initial weights, the same on every rank. Returns the step the metrics log keeps (-1: all).
  int64_t start() {
    const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
    if (cfg.train.threads > cores)
      spdlog::warn("train.threads = {} exceeds this machine's {} cores; using {}", cfg.train.threads, cores, cores);
    set_compute_threads(static_cast<int>(worker_threads(cfg.train.threads)));
    auto& model = task->module();
    task->init_weights(static_cast<uint64_t>(cfg.train.seed));
    optimizer = make_optimizer(model, cfg.train);
    int64_t keep_metrics = -1;
    bool resumed = lead && prepare_run_dir();
    if (par) {  // the others load what rank 0 decided, once its directory work is done
      std::vector<at::Tensor> flag = {torch::tensor({resumed ? 1 : 0}, torch::kLong)};
      par->broadcast(flag);
      resumed = flag[0].item<int64_t>() == 1;
    }
    if (resumed) {
      auto ck = read_checkpoint(opt.resume);
      load_model_tensors(model, ck.model);
      load_optimizer_state(*optimizer, model, ck.optimizer());
      auto st = ck.trainer_state();
      step = st.at("step").get<int64_t>();
      set_rng_state_hex(st.at("rng_cpu").get<std::string>());
      keep_metrics = step;
      spdlog::info("resumed from {} at step {}", ck.dir, step);
    }
    if (opt.resume.empty() && !opt.init_from.empty()) {
      auto ck = read_checkpoint(opt.init_from);
      load_model_tensors(model, ck.model);
      spdlog::info("weights from {}", ck.dir);
    }
    if (par) {  // one starting point on every rank, whatever each initialised
      if (cfg.train.grad_accum % par->world() != 0)
        throw ConfigError(
            fmt::format("train.grad_accum = {} must be a multiple of WORLD_SIZE = {}: each rank takes "
                        "grad_accum / world of every step's micro-batches",
                        cfg.train.grad_accum, par->world()));
      std::vector<at::Tensor> values;
      for (auto& [name, t] : model_tensors(model)) values.push_back(t);
      par->broadcast(values);
    }
    return keep_metrics;
  }

  // What opt.distribute does to the model (expert parallelism); returns environment.json's "parallel".
  std::string distribute() {
    auto& model = task->module();
    counts = task->param_counts();
    std::string parallel = par ? fmt::format("data parallel over {} ranks", par->world()) : "one process";
    if (opt.distribute) {
      dist = opt.distribute(task->feed_forwards());
      parallel += "; " + dist.description;
      narrow_optimizer_state(*optimizer, dist.sharded, par ? par->rank() : 0);
      for (auto& p : model.named_parameters())
        if (is_among(p.value(), dist.sharded))
          for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"}) sharded_names.insert(p.key() + suffix);
    }
    replicated = without(model.parameters(), dist.sharded);
    for (auto& p : model.parameters()) state_bytes += 4 * p.numel() * static_cast<int64_t>(p.element_size());
    together = !dist.sharded.empty();
    return parallel;
  }

  // config.toml, metrics.jsonl and environment.json (rank 0), and the model line.
  void open_run(int64_t keep_metrics, const std::string& parallel) {
    if (lead) {
      fs::create_directories(run_dir / "checkpoints");
      write_file_atomic((run_dir / "config.toml").string(), to_toml(cfg));
    }
    metrics = std::make_unique<MetricsLog>(lead ? (run_dir / "metrics.jsonl").string() : "", keep_metrics);
    if (lead) {
      auto env = environment_json(cfg, counts);
      env["parallel"] = parallel;
      write_file_atomic((run_dir / "environment.json").string(), env.dump(2) + "\n");
    }
    moe = moe_layers(task->feed_forwards());
    rank_state = collect_rank_state(task->module());
    routing = routing_slots(task->feed_forwards());
    spdlog::info(
        "model: {:.2f}M parameters ({:.2f}M without embeddings, {:.2f}M active per token, {} MoE layers), "
        "{} threads; {:.1f} MB of weights, gradients and AdamW moments on this rank",
        counts.total / 1e6, counts.non_embedding / 1e6, counts.active / 1e6, moe.size(), at::get_num_threads(),
        static_cast<double>(state_bytes) / 1e6);
  }

  void prepare_loop() {
    items_per_step = task->items_per_micro_batch() * cfg.train.grad_accum;
    start_step = step;
    end_step = opt.stop_after >= 0 ? std::min(cfg.train.steps, step + opt.stop_after) : cfg.train.steps;
    t0 = std::chrono::steady_clock::now();
    if (opt.profile_steps > 0 && lead) {  // rank 0's steps; ranks writing one file would garble it
      const int64_t warmup = std::clamp<int64_t>(end_step - start_step - opt.profile_steps, 0, 5);
      const auto x = torch::empty({0, cfg.model.d_model}, task->module().parameters().front().options());
      const std::string header =
          moe.empty() ? ""
                      : fmt::format("experts: the {} units path\n", to_string(units_path(x, *moe.front()->experts)));
      profiler =
          std::make_unique<StepProfiler>(start_step + warmup, opt.profile_steps, (run_dir / "profile.json").string(),
                                         (run_dir / "profile.txt").string(), header);
    }
    if (par && par->world() > 1 && cfg.train.overlap_grad_sum) {
      overlap = std::make_unique<GradOverlap>(*par, replicated);
      if (lead)
        spdlog::info("gradient sums start during the backward: {} buckets of at most {} MB", overlap->buckets(),
                     GradOverlap::kBucketBytes >> 20);
    }
    task->module().train();
    reset_peak_rss();  // the peak of the steps, not of building (and cutting) the model
  }

  // One optimizer step: this rank's micro-batches, sums over ranks, clipping, the update (or a
  // skipped step on a non-finite loss or gradient).
  Step train_step() {
    auto& model = task->module();
    if (profiler) profiler->before_step(step);
    Step s;
    s.lr = lr_at(cfg.train, step);
    set_lr(*optimizer, s.lr);
    const auto had_grads = release_grads(*optimizer);
    double loss_sum = 0;
    for (int64_t m = 0; m < cfg.train.grad_accum; ++m) {
      if (par && m % par->world() != par->rank()) continue;                     // another rank's micro-batch
      if (overlap && m + par->world() >= cfg.train.grad_accum) overlap->arm();  // this rank's last
      AuxLosses aux;
      auto loss = task->train_loss(step, m, aux);
      loss_sum += loss.item<double>();
      if (auto a = aux.total(); a.defined()) loss = loss + a;
      (loss / static_cast<double>(cfg.train.grad_accum)).backward();
      if (par) average_over_ranks(*par, rank_state);  // one round of micro-batches done
    }
    restore_zero_grads(had_grads);
    if (par) loss_sum = sum_over_ranks(*par, replicated, moe, loss_sum, overlap.get());
    for (auto& p : dist.sharded)  // as one process, where the whole bank has a gradient
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    const double max_norm = cfg.train.grad_clip > 0 ? cfg.train.grad_clip : std::numeric_limits<double>::infinity();
    s.grad_norm = together ? clip_grad_norm(*par, replicated, dist.sharded, max_norm)
                           : torch::nn::utils::clip_grad_norm_(model.parameters(), max_norm);
    ++step;
    last_loss = loss_sum / static_cast<double>(cfg.train.grad_accum);
    // No pass over the weights on a healthy step: a weight that went non-finite in the last
    // update shows in this loss, and save() checks weights and moments before every write.
    if (!std::isfinite(last_loss) || !std::isfinite(s.grad_norm)) {
      skip_step(s.grad_norm);
    } else {
      optimizer->step();
      for (auto& m : moe) m->after_optimizer_step();
    }
    if (profiler) profiler->after_step(step);
    return s;
  }

  void skip_step(double grad_norm) {
    const auto params = model_tensors(task->module());
    if (auto weight = first_nonfinite(params); !weight.empty())  // not skippable: the weights are lost
      diverged(*metrics, "a weight went non-finite in the optimizer step", weight, false, step - 1);
    auto bad = first_nonfinite(gradients(params));
    const auto what = fmt::format("non-finite {} (loss {:.4g}, gradient norm {:.4g})",
                                  std::isfinite(last_loss) ? "gradient" : "loss", last_loss, grad_norm);
    if (++skipped > cfg.train.skip_nonfinite) diverged(*metrics, what, bad.empty() ? "the loss" : bad, true);
    spdlog::warn("step {}: {}; skipped without an update ({} of train.skip_nonfinite = {})", step, what, skipped,
                 cfg.train.skip_nonfinite);
  }

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }

  void log(const Step& s) {
    const std::string items = task->item_name();
    const double rate = window_items / std::max(window_time, 1e-9);
    nlohmann::json rec = {{"step", step},
                          {"loss", last_loss},
                          {"lr", s.lr},
                          {"grad_norm", s.grad_norm},
                          {"skipped_steps", skipped},
                          {items + "_per_s", rate},
                          {"elapsed_s", elapsed()},
                          {items, step * items_per_step}};
    if (par) {
      rec["world"] = par->world();
      rec[items + "_per_s_per_rank"] = rate / par->world();
      rec["comm_s_per_step"] = par->take_comm_seconds() / static_cast<double>(cfg.train.log_every);
    }
    for (auto* r : routing) rec["moe"].push_back(r->stats_json());
    metrics->write(rec);
    if (!stderr_is_tty())
      spdlog::info("step {}/{} loss {:.4f} lr {:.2e} grad_norm {:.3f} {:.0f} {}/s", step, cfg.train.steps, last_loss,
                   s.lr, s.grad_norm, rate, items);
    window_time = 0;
    window_items = 0;
  }

  void evaluate() {
    val = task->evaluate("val");
    nlohmann::json rec = {
        {"step", step}, {"val_loss", losses_json(val.losses)}, {"val_loss_mean", mean_loss(val.losses)}};
    for (auto& [k, v] : val.metrics.items()) rec["val_" + k] = v;
    metrics->write(rec);
    spdlog::info("{}step {} val loss: {}{}", stderr_is_tty() ? "\n" : "", step, rec["val_loss"].dump(),
                 val.metrics.empty() ? "" : " " + val.metrics.dump());
  }

  // The final evaluation, the sample and summary.json (rank 0; every rank evaluates and samples
  // when the experts are sharded).
  TrainResult finish() {
    const double seconds = elapsed();
    if (!lead && !together) return {run_dir.string(), {}};
    if (val.losses.empty()) val = task->evaluate("val");
    auto* lm = task->language_model();
    const std::string sample = opt.sample && lm ? opt.sample(*lm, task->tokenizer_path()) : "";
    if (!lead) return {run_dir.string(), {}};
    const std::string items = task->item_name();
    const int64_t steps_run = step - start_step;
    nlohmann::json summary = {{"run", cfg.run.name},
                              {"steps", step},
                              {"steps_this_run", steps_run},
                              {"finished", step == cfg.train.steps},
                              {"parameters", counts.total},
                              {"parameters_non_embedding", counts.non_embedding},
                              {"parameters_active", counts.active},
                              {"task", cfg.model.task},
                              {items + "_seen", step * items_per_step},
                              {"elapsed_s", seconds},
                              {items + "_per_s", steps_run * items_per_step / std::max(seconds, 1e-9)},
                              {"final_train_loss", last_loss},
                              {"val_loss", losses_json(val.losses)},
                              {"val_loss_mean", mean_loss(val.losses)},
                              {"threads", at::get_num_threads()},
                              {"commit", build_commit()},
                              {"train_state_mb_rank0", static_cast<double>(state_bytes) / 1e6},
                              {"peak_rss_mb_rank0", static_cast<double>(peak_rss_bytes()) / 1e6},
                              {"sample", sample},
                              {"checkpoint", latest_checkpoint(run_dir.string())}};
    for (auto& [k, v] : val.metrics.items()) summary["val_" + k] = v;
    const auto extra = task->summary_extra();  // items() must not outlive it
    for (auto& [k, v] : extra.items()) summary[k] = v;
    write_file_atomic((run_dir / "summary.json").string(), summary.dump(2) + "\n");
    return {run_dir.string(), summary};
  }
};

}  // namespace

namespace {
// Training holds float32 weights, gradients and AdamW's two moments: refuse a model whose
// parameters alone would not fit, before anything is allocated.
void require_memory(const Config& cfg) {
  const double need = 16.0 * approx_parameters(cfg.model);
  const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (ram > 0 && need > 0.9 * ram)
    throw ConfigError(fmt::format(
        "this model needs about {:.1f} GB to train (~{:.2f} B parameters x 16 bytes for weights, gradients and AdamW "
        "moments) but the machine has {:.1f} GB: reduce model.d_model ({}), model.n_layers ({}), model.ffn_hidden ({}) "
        "or the model.moe sizes",
        need / 1e9, need / 16e9, ram / 1e9, cfg.model.d_model, cfg.model.n_layers, cfg.model.ffn_hidden));
}
}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opt) {
  require_memory(cfg);
  Trainer t(cfg, opt);
  return t.run();
}

}  // namespace mf
