// LR schedule, optimizer groups and state, and bit-exact resume.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "core/util.h"
#include "data/prepare.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "model/transformer.h"
#include "test_support.h"
#include "train/evaluable.h"
#include "train/finite.h"
#include "train/metrics.h"
#include "train/optim.h"
#include "train/repro_runs.h"
#include "train/trainer.h"

using namespace mf;
namespace fs = std::filesystem;

TEST(Schedule, WarmupThenCosine) {
  TrainConfig c;
  c.lr = 1.0;
  c.warmup_steps = 4;
  c.steps = 14;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1.0);  // cosine starts at the peak
  EXPECT_NEAR(lr_at(c, 8), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 4.0 / 9.0)), 1e-12);
  EXPECT_NEAR(lr_at(c, 13), 0.1, 1e-12);  // ends at min_lr_ratio * lr
  c.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 1.0);
}

TEST(Optimizer, NoDecayOnNormsAndEmbeddings) {
  auto mc = test::small_model(11, 8, 1, 2, 1);
  mc.ffn_hidden = 8;
  TransformerLM m(mc);
  TrainConfig tc;
  tc.weight_decay = 0.5;
  auto opt = make_optimizer(*m, tc);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  auto& decayed = opt->param_groups()[0];
  auto& plain = opt->param_groups()[1];
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(decayed.options()).weight_decay(), 0.5);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(plain.options()).weight_decay(), 0.0);
  // embed + 2 norms per layer + final norm
  EXPECT_EQ(plain.params().size(), 4u);
  EXPECT_EQ(decayed.params().size(), 8u);  // q k v o, gate up down, lm_head
  tc.decay_embeddings = true;
  EXPECT_EQ(make_optimizer(*m, tc)->param_groups()[1].params().size(), 3u);
}

TEST(Optimizer, StateRoundTripsThroughTensors) {
  auto mc = test::small_model(11, 8, 1, 2, 1);
  mc.ffn_hidden = 8;
  TransformerLM a(mc), b(mc);
  a->init_weights(1);
  TrainConfig tc;
  auto oa = make_optimizer(*a, tc);
  auto tokens = torch::randint(0, 11, {2, 5}, torch::kLong);
  for (int i = 0; i < 3; ++i) {
    oa->zero_grad();
    lm_loss(a->forward(tokens), tokens).backward();
    oa->step();
  }
  auto saved = parse_safetensors(serialize_safetensors(optimizer_state_tensors(*oa, *a)), "mem");
  auto weights = parse_safetensors(serialize_safetensors(model_tensors(*a)), "mem");
  load_model_tensors(*b, weights);
  auto ob = make_optimizer(*b, tc);
  load_optimizer_state(*ob, *b, saved);
  for (auto* o : {oa.get(), ob.get()}) {
    auto& m = o == oa.get() ? a : b;
    o->zero_grad();
    lm_loss(m->forward(tokens), tokens).backward();
    o->step();
  }
  for (auto& p : a->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), b->named_parameters()[p.key()])) << p.key();
}

class TrainRun : public ::testing::Test {
 protected:
  Config base;
  void SetUp() override {  // ctest runs tests as parallel processes: one directory each
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    base.data.dir = (fs::temp_directory_path() / ("mf_train_data_" + name)).string();
    base.data.max_source_bytes = 60000;
    base.data.tokenizer_sample_bytes = 30000;
    base.data.vocab_size = 400;
    prepare_corpus(base.data, false);
    base.model.d_model = 32;
    base.model.n_layers = 2;
    base.model.n_heads = 4;
    base.model.n_kv_heads = 2;
    base.model.ffn_hidden = 48;
    base.model.max_seq_len = 64;
    base.train.seq_len = 16;
    base.train.batch_size = 4;
    base.train.grad_accum = 2;
    base.train.steps = 8;
    base.train.warmup_steps = 2;
    base.train.log_every = 1;
    base.train.threads = 1;
    base.train.ckpt_every = 0;
    base.eval.every = 4;
    base.eval.windows = 4;
    base.sample.max_tokens = 4;
    base.run.out_dir = (fs::temp_directory_path() / ("mf_train_runs_" + name)).string();
    fs::remove_all(base.run.out_dir);
  }
};

namespace {
// N straight steps = N/2 steps, stop, resume, N/2 steps: identical weights, validation and
// per-step training losses, and one metrics line per step.
void expect_exact_resume(const Config& base) {
  Config straight = base;
  straight.run.name = "straight";
  auto a = train(straight, {});
  EXPECT_TRUE(a.summary["finished"].get<bool>());

  Config split = base;
  split.run.name = "split";
  TrainOptions first;
  first.stop_after = base.train.steps / 2;
  auto half = train(split, first);
  EXPECT_FALSE(half.summary["finished"].get<bool>());
  EXPECT_EQ(half.summary["steps"], base.train.steps / 2);
  TrainOptions second;
  second.resume = half.run_dir;
  auto b = train(split, second);
  EXPECT_EQ(b.summary["steps"], base.train.steps);

  auto wa = read_checkpoint(a.run_dir).model, wb = read_checkpoint(b.run_dir).model;
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  for (auto& [name, t] : wa.tensors) EXPECT_TRUE(torch::equal(t, wb.at(name))) << name;
  EXPECT_EQ(a.summary["val_loss"], b.summary["val_loss"]);

  // metrics of the resumed run: one line per step, no duplicates from the first half
  auto lines = read_metrics(b.run_dir + "/metrics.jsonl");
  int train_lines = 0;
  for (auto& l : lines) train_lines += l.contains("loss");
  EXPECT_EQ(train_lines, base.train.steps);
  auto ref = read_metrics(a.run_dir + "/metrics.jsonl");
  for (size_t i = 0; i < lines.size() && i < ref.size(); ++i)
    if (lines[i].contains("loss")) {
      EXPECT_EQ(lines[i]["loss"], ref[i]["loss"]) << "line " << i;
    }
}
}  // namespace

TEST_F(TrainRun, ResumeIsBitIdentical) { expect_exact_resume(base); }

// The image classifier: a tiny ViT on Fashion-MNIST (Debian's dataset-fashion-mnist), with
// augmentation, so the sampler's crops and flips must replay exactly too.
TEST(ClassifyRun, ResumeIsBitIdentical) {
  Config c;
  c.model = test::small_model(0, 16, 2, 4, 4);
  c.model.task = "classify";
  c.model.patch_size = 7;
  c.model.ffn = "gelu";
  c.model.ffn_hidden = 24;
  c.data.val_images = 200;
  c.train.batch_size = 8;
  c.train.grad_accum = 2;
  c.train.steps = 6;
  c.train.warmup_steps = 2;
  c.train.log_every = 1;
  c.train.threads = 1;
  c.train.ckpt_every = 0;
  c.eval.every = 3;
  c.eval.batch_size = 100;
  c.run.out_dir = (fs::temp_directory_path() / "mf_train_runs_classify").string();
  fs::remove_all(c.run.out_dir);
  validate(c);
  expect_exact_resume(c);
  auto s = nlohmann::json::parse(read_file(c.run.out_dir + "/straight/summary.json"));
  EXPECT_EQ(s["task"], "classify");
  EXPECT_GT(s["val_accuracy"].get<double>(), 0.0);
  EXPECT_EQ(s["images_seen"], 6 * 16);
}

TEST_F(TrainRun, RefusesToClobberAndWritesRunFiles) {
  Config c = base;
  c.run.name = "files";
  c.train.steps = 2;
  auto r = train(c, {});
  for (auto f : {"config.toml", "metrics.jsonl", "summary.json"}) EXPECT_TRUE(fs::exists(r.run_dir + "/" + f)) << f;
  EXPECT_FALSE(latest_checkpoint(r.run_dir).empty());
  EXPECT_THROW(train(c, {}), std::runtime_error);
  TrainOptions o;
  o.overwrite = true;
  EXPECT_NO_THROW(train(c, o));
  auto cfg = checkpoint_config(r.run_dir);
  EXPECT_EQ(cfg.model.d_model, 32);
  EXPECT_EQ(cfg.model.vocab_size, 400);
  auto s = r.summary;
  EXPECT_GT(s["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(s["val_loss"].size(), 4u);
}

// A run killed before its first checkpoint (a config.toml, an empty or leftover-only
// checkpoints/) starts again from step 0, both as a plain `train` and with --resume.
TEST_F(TrainRun, ARunKilledBeforeItsFirstCheckpointStartsAgain) {
  for (const bool resume : {false, true}) {
    Config c = base;
    c.run.name = resume ? "early_resume" : "early";
    c.train.steps = 2;
    const auto run = fs::path(c.run.out_dir) / c.run.name;
    fs::create_directories(run / "checkpoints" / ".tmp-step_00000001");
    write_file_atomic((run / "config.toml").string(), to_toml(c));
    TrainOptions o;
    if (resume) o.resume = run.string();
    const auto r = train(c, o);
    EXPECT_EQ(r.summary["steps"].get<int64_t>(), 2);
    EXPECT_FALSE(fs::exists(run / "checkpoints" / ".tmp-step_00000001"));
    EXPECT_FALSE(latest_checkpoint(run.string()).empty());
  }
}

TEST_F(TrainRun, AModelThatCannotFitIsRefusedBeforeAllocating) {
  Config c = base;
  c.run.name = "huge";
  c.model.d_model = 65536;
  c.model.n_layers = 512;
  c.model.ffn_hidden = 1 << 20;  // ~1e14 parameters
  try {
    train(c, {});
    FAIL() << "an impossible model was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.d_model (65536)"), std::string::npos) << e.what();
  }
  // the estimate is close for a plain model: embeddings + attention + SwiGLU
  ModelConfig m = base.model;
  m.vocab_size = 400;
  TransformerLM small(m);
  EXPECT_NEAR(approx_parameters(m) / static_cast<double>(small->param_counts().total), 1.0, 0.05);
  // and for GELU experts with biases (the upcycled ViT's kind) and a shared expert
  m.ffn = "moe";
  m.moe.layers = "all";
  m.moe.activation = Activation::GELU;
  m.moe.expert_bias = true;
  m.moe.shared_hidden = 48;
  TransformerLM gelu(m);
  EXPECT_NEAR(approx_parameters(m) / static_cast<double>(gelu->param_counts().total), 1.0, 0.05);
  // and with dense blocks beside the MoE ones (counted as MoE blocks, this estimate was 1.8x the true count)
  m.moe.layers = "every_other";
  m.moe.num_experts = 8;
  TransformerLM mixed(m);
  EXPECT_NEAR(approx_parameters(m) / static_cast<double>(mixed->param_counts().total), 1.0, 0.05);
}

// A run whose weights or loss go non-finite stops at that step, names the tensor, and never
// writes a checkpoint from it: the last good checkpoint stays the latest.
TEST_F(TrainRun, DivergenceStopsAtItsStepAndKeepsTheLastGoodCheckpoint) {
  const auto message_of = [](const Config& c, const TrainOptions& o) -> std::string {
    try {
      train(c, o);
    } catch (const DivergenceError& e) {
      return e.what();
    }
    return "no divergence";
  };
  Config eps = base;  // adam_eps = 0: 0/0 in the update of every weight whose gradient is 0
  eps.run.name = "eps";
  eps.train.adam_eps = 0;
  auto m = message_of(eps, {});
  EXPECT_NE(m.find("step 1: a weight went non-finite in the optimizer step"), std::string::npos) << m;
  EXPECT_NE(m.find("first non-finite tensor: 'model."), std::string::npos) << m;
  EXPECT_TRUE(latest_checkpoint(eps.run.out_dir + "/eps").empty());
  std::ifstream metrics(eps.run.out_dir + "/eps/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  EXPECT_NE(last.find("\"diverged\""), std::string::npos) << last;

  Config zero = base;  // zero weights and norm_eps = 0: RMSNorm computes 0/0, so the loss is NaN from step 1
  zero.run.name = "zero";
  zero.model.init_std = 0;
  zero.model.norm_eps = 0;
  zero.train.skip_nonfinite = 3;
  m = message_of(zero, {});
  EXPECT_NE(m.find("step 4: non-finite loss"), std::string::npos) << m;  // steps 1-3 skipped

  Config good = base;
  good.run.name = "good";
  good.train.ckpt_every = 2;
  TrainOptions first;
  first.stop_after = 4;
  train(good, first);
  const auto last_good = latest_checkpoint(good.run.out_dir + "/good");
  Config wild = good;
  wild.train.lr = 1e38;  // the next update overflows
  TrainOptions resume;
  resume.resume = good.run.out_dir + "/good";
  m = message_of(wild, resume);
  EXPECT_NE(m.find("the latest good one is " + last_good), std::string::npos) << m;
  EXPECT_EQ(latest_checkpoint(good.run.out_dir + "/good"), last_good);

  // evaluating weights with a NaN is refused, naming the tensor
  const auto ck = read_checkpoint(last_good);
  NamedTensors weights(ck.model.tensors.begin(), ck.model.tensors.end());
  weights.front().second = weights.front().second.clone().fill_(std::numeric_limits<float>::quiet_NaN());
  const auto optimizer = ck.optimizer();
  const auto nan_dir = good.run.out_dir + "/nan_checkpoint";
  write_checkpoint(nan_dir, {weights, NamedTensors(optimizer.tensors.begin(), optimizer.tensors.end()),
                             ck.model.metadata, ck.trainer_state(), ""});
  try {
    open_evaluable(nan_dir, 2);
    FAIL() << "a checkpoint with NaN weights was evaluated";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + weights.front().first + "' holds NaN"), std::string::npos) << e.what();
  }
}

// A fine-tune trains on one domain; its pretraining on every other.
TEST(Repro, DomainWeightsPickOneDomainOrLeaveItOut) {
  Config cfg;
  weight_domains(cfg, "technical", true);
  EXPECT_EQ(cfg.data.weight_technical, 1.0);
  EXPECT_EQ(cfg.data.weight_dictionary + cfg.data.weight_scripture + cfg.data.weight_quotations, 0.0);
  weight_domains(cfg, "scripture", false);
  EXPECT_EQ(cfg.data.weight_scripture, 0.0);
  EXPECT_EQ(cfg.data.weight_dictionary + cfg.data.weight_technical + cfg.data.weight_quotations, 3.0);
  try {
    weight_domains(cfg, "poetry", true);
    FAIL() << "an unknown domain was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'poetry'"), std::string::npos) << e.what();
  }
}

// A finished run whose stored config predates keys added since (they take their defaults) is
// reused, not retrained; a real difference still retrains.
TEST(Repro, FinishedRunWithOlderConfigTextIsReused) {
  namespace fs = std::filesystem;
  Config cfg;
  cfg.run.out_dir = (fs::temp_directory_path() / "mf_reuse").string();
  cfg.run.name = "arm";
  cfg.data.dir = "/nonexistent-corpus";  // training would fail at once
  const auto dir = fs::path(cfg.run.out_dir) / "arm";
  fs::remove_all(cfg.run.out_dir);
  fs::create_directories(dir);
  std::string older;  // today's TOML without one method's keys, as an older run wrote it
  std::stringstream in(to_toml(cfg));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("moe.intb.", 0) != 0) older += line + "\n";
  ASSERT_NE(older, to_toml(cfg));
  write_file_atomic((dir / "config.toml").string(), older);
  write_file_atomic((dir / "summary.json").string(), R"({"finished": true})");
  EXPECT_EQ(run_variant(cfg), dir.string());
  cfg.train.lr = 0.5;
  EXPECT_ANY_THROW(run_variant(cfg)) << "a changed config was reused";
  fs::remove_all(cfg.run.out_dir);
}

// --part I/N: the run at position p (0-based, distinct runs) is trained by part p % N + 1; a
// part waits for (here: finds finished) the others' runs and trains its own.
TEST(Repro, PartsShareTheRunsByPosition) {
  namespace fs = std::filesystem;
  EXPECT_EQ(RunShare::parse("2/3").index, 2);
  EXPECT_EQ(RunShare::parse("2/3").count, 3);
  for (const auto* bad : {"0/2", "3/2", "1", "1/0", "a/b", "1/2x"}) EXPECT_ANY_THROW(RunShare::parse(bad)) << bad;
  Config cfg;
  cfg.run.out_dir = (fs::temp_directory_path() / "mf_parts").string();
  cfg.data.dir = "/nonexistent-corpus";  // training would fail at once
  fs::remove_all(cfg.run.out_dir);
  cfg.run.name = "first";
  fs::create_directories(fs::path(cfg.run.out_dir) / "first");
  write_file_atomic(cfg.run.out_dir + "/first/config.toml", to_toml(cfg));
  write_file_atomic(cfg.run.out_dir + "/first/summary.json", R"({"finished": true})");
  variant_runs().clear();
  set_run_share(RunShare::parse("2/2"));
  EXPECT_EQ(run_variant(cfg), cfg.run.out_dir + "/first");  // part 1's: waited for, not trained
  cfg.run.name = "second";
  EXPECT_ANY_THROW(run_variant(cfg)) << "part 2 did not train its own run";
  cfg.run.name = "first";
  EXPECT_EQ(run_variant(cfg), cfg.run.out_dir + "/first") << "a run handed out before keeps its position";
  set_run_share({});
  variant_runs().clear();
  fs::remove_all(cfg.run.out_dir);
}

// A measurement over several runs is taken once all have finished, by the part that owns the first.
TEST(Repro, MeasureWhenFinishedWaitsForEveryRunAndItsPart) {
  namespace fs = std::filesystem;
  Config a, b;
  a.run.out_dir = b.run.out_dir = (fs::temp_directory_path() / "mf_when_finished").string();
  a.data.dir = b.data.dir = "/nonexistent-corpus";
  a.run.name = "a", b.run.name = "b";
  fs::remove_all(a.run.out_dir);
  auto finish = [](const Config& c) {
    fs::create_directories(fs::path(c.run.out_dir) / c.run.name);
    write_file_atomic(c.run.out_dir + "/" + c.run.name + "/config.toml", to_toml(c));
    write_file_atomic(c.run.out_dir + "/" + c.run.name + "/summary.json", R"({"finished": true})");
  };
  variant_runs().clear();
  int calls = 0;
  auto measure = [&] { return nlohmann::json{{"value", ++calls}}; };
  finish(a);
  measure_when_finished({a, b}, "timing", measure);
  EXPECT_EQ(calls, 0) << "measured before b finished";
  finish(b);
  set_run_share(RunShare::parse("2/2"));  // a is part 1's
  measure_when_finished({a, b}, "timing", measure);
  EXPECT_EQ(calls, 0) << "measured by the part that does not own a";
  set_run_share({});
  measure_when_finished({a, b}, "timing", measure);
  measure_when_finished({a, b}, "timing", measure);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(nlohmann::json::parse(read_file(a.run.out_dir + "/a/measures.json")).contains("timing"));
  variant_runs().clear();
  fs::remove_all(a.run.out_dir);
}

// A run's measurement is computed once and kept beside it until the run's summary changes.
TEST(Repro, RunMeasureIsKeptUntilTheRunChanges) {
  namespace fs = std::filesystem;
  const auto dir = (fs::temp_directory_path() / "mf_measure").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_file_atomic(dir + "/summary.json", R"({"finished": true, "val_loss_mean": 4.5})");
  int calls = 0;
  auto measure = [&] { return nlohmann::json{{"value", ++calls}}; };
  EXPECT_EQ(run_measure(dir, "probe", measure)["value"], 1);
  EXPECT_EQ(run_measure(dir, "probe", measure)["value"], 1) << "measured again";
  EXPECT_EQ(run_measure(dir, "usage", measure)["value"], 2);
  write_file_atomic(dir + "/summary.json", R"({"finished": true, "val_loss_mean": 4.4})");  // retrained
  EXPECT_EQ(run_measure(dir, "probe", measure)["value"], 3) << "a stale measurement was kept";
  fs::remove_all(dir);
}
