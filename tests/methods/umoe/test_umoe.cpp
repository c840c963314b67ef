// UMoE: REAP saliency against a per-token reference written from the spec (float64), batch
// merging, layer-by-layer calibration, the surgery's bookkeeping and noise, and the errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/hf_fixture.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "methods/umoe/specialisation.h"
#include "methods/umoe/umoe.h"
#include "model/moe_ffn.h"
#include "test_support.h"

using namespace mf;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny_moe(bool renormalize, int64_t experts = 6, int64_t top_k = 2) {
  auto c = test::small_moe(40, 16, 2, experts, top_k, 12);
  c.moe.renormalize = renormalize;
  return c;
}

// S(e) straight from the definition, one token at a time: logits W x, g = softmax over all E
// (divided by the selected experts' sum when renormalising, clamped at float32 eps),
// ||E_e(x)||_2 = ||down_e (silu(gate_e x) * up_e x)||, averaged over the tokens that selected e.
std::vector<double> reference_saliency(MoEFeedForward& m, const at::Tensor& x_TD, bool renormalize) {
  const auto& W = m.gate->weight;
  const auto& gu = m.experts->gate_up_proj;
  const auto& dn = m.experts->down_proj;
  const int64_t E = W.size(0), K = m.shape().top_k, F = dn.size(2);
  std::vector<double> sum(E, 0), n(E, 0);
  for (int64_t t = 0; t < x_TD.size(0); ++t) {
    auto x = x_TD[t];
    auto p = torch::softmax(torch::mv(W, x), 0);
    auto sel = std::get<1>(p.topk(K));
    double selected = 0;
    for (int64_t j = 0; j < K; ++j) selected += p[sel[j].item<int64_t>()].item<double>();
    for (int64_t j = 0; j < K; ++j) {
      const auto e = sel[j].item<int64_t>();
      double g = p[e].item<double>();
      if (renormalize) g = std::max<double>(g / selected, std::numeric_limits<float>::epsilon());
      auto h = torch::silu(torch::mv(gu[e].narrow(0, 0, F), x)) * torch::mv(gu[e].narrow(0, F, F), x);
      sum[e] += g * torch::mv(dn[e], h).norm().item<double>();
      n[e] += 1;
    }
  }
  for (int64_t e = 0; e < E; ++e) sum[e] = n[e] > 0 ? sum[e] / n[e] : 0;
  return sum;
}

std::shared_ptr<MoEFeedForward> double_layer(const ModelConfig& c) {
  auto plan = plan_moe(c);
  auto m = std::make_shared<MoEFeedForward>(c, 0, plan);
  m->to(torch::kFloat64);
  m->eval();
  return m;
}

LayerSaliency layer_saliency(MoEFeedForward& m, const std::vector<at::Tensor>& batches, bool renormalize) {
  SaliencyAccumulator acc(m.shape().num_experts);
  m.dispatch_hook = [&](const at::Tensor& x, const RouterOutput& r) { acc.add(x, r, *m.experts, renormalize); };
  AuxLosses aux;
  torch::NoGradGuard g;
  for (auto& b : batches) m.forward(b, aux);
  m.dispatch_hook = nullptr;
  return acc.result(0);
}

std::string write_lm_checkpoint(const Config& cfg, TransformerLM& m, const std::string& name) {
  auto dir = (fs::temp_directory_path() / ("mf_umoe_" + name)).string();
  fs::remove_all(dir);
  write_checkpoint(dir,
                   {model_tensors(*m),
                    {},
                    {{"moeforge.config", to_toml(cfg)}, {"moeforge.vocab_size", std::to_string(cfg.model.vocab_size)}},
                    {{"step", 0}},
                    ""});
  return dir;
}

}  // namespace

TEST(UMoE, ReapGatesByHand) {
  auto probs = torch::tensor({0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 1 - 2e-9, 1e-9, 1e-9}, torch::kFloat64).view({3, 3});
  Assignment a;
  a.token_P = torch::tensor({0, 0, 1, 1, 2, 2}, torch::kLong);
  a.unit_P = torch::tensor({0, 1, 1, 2, 0, 1}, torch::kLong);
  auto raw = reap_gates(probs, a, false);
  auto ren = reap_gates(probs, a, true);
  const std::vector<double> want_raw = {0.5, 0.3, 0.6, 0.3, 1 - 2e-9, 1e-9};
  const double eps = std::numeric_limits<float>::epsilon();
  const std::vector<double> want_ren = {0.625, 0.375, 2.0 / 3, 1.0 / 3, (1 - 2e-9) / (1 - 1e-9), eps};  // clamped
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(raw[i].item<double>(), want_raw[i], 1e-15) << i;
    EXPECT_NEAR(ren[i].item<double>(), want_ren[i], 1e-15) << i;
  }
}

TEST(UMoE, SaliencyEqualsPerTokenReferenceAndBatchesMerge) {
  torch::manual_seed(3);
  for (bool renormalize : {true, false}) {
    auto c = tiny_moe(renormalize);
    auto m = double_layer(c);
    {
      torch::NoGradGuard g;  // an expert no token can select: logit -10 vs >= +6 through the constant feature
      m->gate->weight.normal_(0, 1).select(1, 0).fill_(10);
      m->gate->weight[5][0] = -10;
      for (auto& p : m->experts->parameters()) p.normal_(0, 0.3);
    }
    auto x = torch::randn({2, 9, 16}, torch::kFloat64);
    x.select(2, 0).fill_(1);
    auto whole = layer_saliency(*m, {x}, renormalize);
    auto split = layer_saliency(*m, {x.narrow(0, 0, 1), x.narrow(0, 1, 1)}, renormalize);
    auto want = reference_saliency(*m, x.view({-1, 16}), renormalize);
    int64_t total = 0;
    for (int64_t e = 0; e < 6; ++e) {
      EXPECT_NEAR(whole.saliency[e], want[e], 1e-12 * (1 + want[e])) << "expert " << e << " renorm " << renormalize;
      EXPECT_NEAR(split.saliency[e], whole.saliency[e], 1e-12 * (1 + want[e])) << "batches merge";
      EXPECT_EQ(split.tokens[e], whole.tokens[e]);
      total += whole.tokens[e];
    }
    EXPECT_EQ(total, 18 * 2);
    EXPECT_EQ(whole.tokens[5], 0);
    EXPECT_EQ(whole.saliency[5], 0.0);  // never selected: least salient
    EXPECT_GT(whole.saliency[0] + whole.saliency[1], 0.0);
  }
}

TEST(UMoE, LayerByLayerCalibrationEqualsTheWholeModel) {
  torch::manual_seed(5);
  Config cfg;
  cfg.model = tiny_moe(true, 4, 2);
  cfg.model.moe.n_shared = 1;
  cfg.model.moe.layers = "1";  // block 0 dense: the stream must pass through it too
  TransformerLM m(cfg.model);
  m->init_weights(11);
  auto dir = write_lm_checkpoint(cfg, m, "layerwise");
  auto windows = torch::randint(40, {5, 7}, torch::kLong);
  auto full = model_saliency(*load_model(dir).model, windows, 2);
  LayerwisePeak peak;
  auto streamed = layerwise_saliency(dir, windows, 3, &peak);
  ASSERT_EQ(full.size(), 1u);
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(streamed[0].layer, 1);
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_EQ(streamed[0].tokens[e], full[0].tokens[e]);
    EXPECT_NEAR(streamed[0].saliency[e], full[0].saliency[e], 1e-6 * full[0].saliency[e]) << e;
  }
  EXPECT_GT(peak.model_bytes, peak.largest_block_bytes);
  EXPECT_GT(peak.largest_block_bytes, 0);
  EXPECT_GT(peak.peak_rss_bytes, 0);
  fs::remove_all(dir);
}

namespace {

// Saliency {5, 1, 7, 0, 3, 3, 2, 6}: the lowest half is {3, 1, 6, 4} (4 before 5 on the tie);
// survivors by saliency: 2, 7, 0, 5; freed slots 1, 3, 4, 6 get parents 2, 7, 0, 5 in turn.
LayerSaliency hand_saliency(int64_t layer) { return {layer, {5, 1, 7, 0, 3, 3, 2, 6}, {9, 2, 11, 0, 4, 5, 3, 8}, {}}; }

struct SurgerySetup {
  Config cfg;
  std::map<std::string, at::Tensor> tensors;
  std::vector<LayerSaliency> saliency;
};

SurgerySetup surgery_setup(int64_t d_model = 16, int64_t hidden = 12) {
  SurgerySetup s;
  s.cfg.model = test::small_moe(40, d_model, 2, 8, 2, hidden);
  s.cfg.model.moe.bias_update = 1e-3;  // a selection bias buffer that must follow its expert
  TransformerLM m(s.cfg.model);
  m->init_weights(2);
  for (auto& [name, t] : model_tensors(*m)) s.tensors[name] = t.detach().clone();
  for (int64_t l = 0; l < 2; ++l)
    s.tensors[fmt::format("model.layers.{}.mlp.gate.selection_bias", l)] = torch::arange(8, torch::kFloat) + 10 * l;
  s.saliency = {hand_saliency(0), hand_saliency(1)};
  return s;
}

}  // namespace

TEST(UMoE, SurgeryBookkeepingByHand) {
  auto s = surgery_setup();
  SurgeryOptions o;
  o.sigma = 0;
  auto r = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  const std::vector<int64_t> pruned = {1, 3, 4, 6}, source = {0, 2, 2, 7, 0, 5, 5, 7};
  ASSERT_EQ(r.layers.size(), 2u);
  for (auto& l : r.layers) {
    EXPECT_EQ(l.pruned, pruned);
    EXPECT_EQ(l.source, source);
  }
  ASSERT_EQ(r.tensors.size(), s.tensors.size());
  int64_t before = 0, after = 0;
  for (auto& [name, t] : s.tensors) {
    ASSERT_TRUE(r.tensors.count(name)) << name;
    EXPECT_EQ(r.tensors.at(name).sizes(), t.sizes()) << name;
    before += t.numel(), after += r.tensors.at(name).numel();
  }
  EXPECT_EQ(before, after);
  EXPECT_EQ(r.config.model.moe.num_experts, 8);
  const auto bias = r.tensors.at("model.layers.1.mlp.gate.selection_bias");
  for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(bias[e].item<float>(), 10 + source[e]);
  // not an expert tensor: untouched
  EXPECT_TRUE(torch::equal(r.tensors.at("model.layers.0.self_attn.q_proj.weight"),
                           s.tensors.at("model.layers.0.self_attn.q_proj.weight")));
  auto report = surgery_report(r, s.saliency, o);
  EXPECT_EQ(report["layers"][0]["parent"], nlohmann::json(source));
  EXPECT_NEAR(report["layers"][0]["routed_share_of_pruned"].get<double>(), (2 + 0 + 4 + 3) / 42.0, 1e-12);
}

// sigma = 0: a clone is its parent, output and gate logit, bit for bit.
TEST(UMoE, UnperturbedCloneComputesItsParent) {
  auto s = surgery_setup();
  SurgeryOptions o;
  o.sigma = 0;
  auto r = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  TransformerLM m(s.cfg.model);
  SafetensorsData st;
  st.tensors = r.tensors;
  load_model_tensors(*m, st);
  auto moe = moe_layers(m->feed_forwards());
  auto x = torch::randn({5, 16});
  torch::NoGradGuard g;
  for (auto& layer : moe) {
    auto logits = torch::matmul(x, layer->gate->weight.t());
    for (auto [slot, parent] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 7}, {4, 0}, {6, 5}}) {
      EXPECT_TRUE(torch::equal(layer->experts->forward_unit(slot, x), layer->experts->forward_unit(parent, x)));
      EXPECT_TRUE(torch::equal(logits.select(1, slot), logits.select(1, parent)));
    }
  }
}

TEST(UMoE, PerturbationHasTheRequestedStdAndIndependentNoise) {
  auto s = surgery_setup(64, 128);
  SurgeryOptions o;
  o.sigma = 0.05;
  o.seed = 9;
  auto r = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  const std::string name = "model.layers.0.mlp.experts.down_proj";
  const auto& old = s.tensors.at(name);
  const auto& now = r.tensors.at(name);
  for (auto [slot, parent] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 7}, {4, 0}, {6, 5}}) {
    auto scale = o.sigma * old[parent].std().item<double>();
    auto clone_noise = (now[slot] - old[parent]) / scale, parent_noise = (now[parent] - old[parent]) / scale;
    // 8192 draws each: std within a few sampling errors (~0.8 %) of 1; the two noises uncorrelated
    EXPECT_NEAR(clone_noise.std().item<double>(), 1.0, 0.04);
    EXPECT_NEAR(parent_noise.std().item<double>(), 1.0, 0.04);
    auto corr = (clone_noise * parent_noise).mean().item<double>();
    EXPECT_LT(std::abs(corr), 0.05) << "parent and clone share noise";
  }
  const auto& router = s.tensors.at("model.layers.0.mlp.gate.weight");
  auto rnoise = (r.tensors.at("model.layers.0.mlp.gate.weight")[1] - router[2]) / (o.sigma * router.std());
  EXPECT_NEAR(rnoise.std().item<double>(), 1.0, 0.3);  // 64 draws
  EXPECT_FALSE(torch::equal(r.tensors.at("model.layers.0.mlp.gate.weight")[2], router[2]));
  // survivors without clones do not exist here (half pruned); biases are never perturbed
  o.one_sided = true;
  auto one = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  for (int64_t parent : {2, 7, 0, 5}) {
    EXPECT_TRUE(torch::equal(one.tensors.at(name)[parent], old[parent])) << "one-sided touched parent " << parent;
    EXPECT_TRUE(torch::equal(one.tensors.at("model.layers.0.mlp.gate.weight")[parent], router[parent]));
  }
  EXPECT_FALSE(torch::equal(one.tensors.at(name)[1], old[2]));
  // same seed, same result
  auto again = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  EXPECT_TRUE(torch::equal(again.tensors.at(name), one.tensors.at(name)));
}

TEST(UMoE, PruneOnlyKeepsTheSurvivorsInOrder) {
  auto s = surgery_setup();
  SurgeryOptions o;
  o.prune_only = true;
  auto r = umoe_surgery(s.tensors, s.cfg, s.saliency, o);
  const std::vector<int64_t> kept = {0, 2, 5, 7};
  EXPECT_EQ(r.layers[0].source, kept);
  EXPECT_EQ(r.config.model.moe.num_experts, 4);
  const auto& gu = s.tensors.at("model.layers.1.mlp.experts.gate_up_proj");
  const auto& now = r.tensors.at("model.layers.1.mlp.experts.gate_up_proj");
  ASSERT_EQ(now.size(0), 4);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(now[i], gu[kept[i]]));
  TransformerLM m(r.config.model);  // the pruned model loads into a config of 4 experts
  SafetensorsData st;
  st.tensors = r.tensors;
  EXPECT_NO_THROW(load_model_tensors(*m, st));
}

TEST(UMoE, BrokenInputsGiveClearErrors) {
  auto s = surgery_setup();
  auto message = [&](auto f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (double p : {0.0, 1.0, 1.5, -0.2}) {
    SurgeryOptions o;
    o.prune = p;
    EXPECT_NE(message([&] { umoe_surgery(s.tensors, s.cfg, s.saliency, o); }).find("--prune"), std::string::npos) << p;
  }
  SurgeryOptions few;
  few.prune = 0.1;  // floor(0.8) = 0 experts
  EXPECT_NE(message([&] { umoe_surgery(s.tensors, s.cfg, s.saliency, few); }).find("at least one"), std::string::npos);
  auto dense = test::small_model(40, 16, 2);
  EXPECT_NE(message([&] { check_reap_model(dense); }).find("no MoE layers"), std::string::npos);
  auto norm = tiny_moe(true);
  norm.moe.router = RouterKind::NormTopK;
  EXPECT_NE(message([&] { check_reap_model(norm); }).find("softmax"), std::string::npos);
  CalibrationSource c;
  c.source = "no-such-domain";
  c.data_dir = "/nonexistent-corpus";
  auto e = message([&] { calibration_windows(c, s.cfg, ""); });
  EXPECT_NE(e.find("no-such-domain"), std::string::npos) << e;
  EXPECT_NE(e.find("/nonexistent-corpus"), std::string::npos) << e;
}

TEST(UMoE, DomainDivergenceByHand) {
  EXPECT_NEAR(mf::js_divergence({1, 0}, {0, 1}), 1.0, 1e-15);  // disjoint: 1 bit
  EXPECT_NEAR(mf::js_divergence({3, 1}, {6, 2}), 0.0, 1e-15);  // the same shares
  // p = (1, 0), q = (1/2, 1/2), m = (3/4, 1/4): KL(p||m) = log2(4/3), KL(q||m) = 1/2 log2(2/3) + 1/2 log2 2
  const double expect = 0.5 * std::log2(4.0 / 3) + 0.5 * (0.5 * std::log2(2.0 / 3) + 0.5);
  EXPECT_NEAR(mf::js_divergence({2, 0}, {5, 5}), expect, 1e-15);
  EXPECT_NEAR(expect, 0.3113, 1e-4);
  // three domains, one layer: pairs (a,b) = 1, (a,c) = 0, (b,c) = 1 -> mean 2/3
  const auto d = mf::domain_divergence({{{1, 0}}, {{0, 1}}, {{4, 0}}});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NEAR(d[0], 2.0 / 3, 1e-15);
  EXPECT_THROW(mf::js_divergence({0, 0}, {1, 1}), std::invalid_argument);
}

// `umoe` streams (one tensor in memory at a time) and writes what the in-memory surgery gives, bit
// for bit; a Hugging Face directory goes through it as its imported checkpoint does (it once kept
// the Hugging Face tensors under a config of fewer experts): the same tensors, config and tokenizer.
TEST(UMoE, StreamedSurgeryEqualsTheInMemoryOneFromACheckpointOrAHuggingFaceDirectory) {
  const auto dir = hf_fixture::scratch("umoe_hf");
  hf_fixture::spm_tokenizer(dir);
  const auto hf_dir =
      hf_fixture::tiny_model(dir / "m", "mixtral", {}, fmt::format("--vocab 416 --tokenizer {}", dir.string()));
  hf::import_hf(hf_dir, (dir / "ckpt").string());
  write_file_atomic((dir / "calib.txt").string(), read_file(hf_fixture::source_dir() + "/README.md").substr(0, 4000));
  const CalibrationSource calib{(dir / "calib.txt").string(), 8, 16, ""};
  for (const bool prune_only : {true, false}) {
    SurgeryOptions o;
    o.prune_only = prune_only;
    run_umoe(hf_dir, calib, o, (dir / "from_hf").string(), 4, false);
    const auto streamed = run_umoe((dir / "ckpt").string(), calib, o, (dir / "from_ckpt").string(), 4, false);
    const auto in_memory = umoe_surgery(read_checkpoint((dir / "ckpt").string()).model.tensors,
                                        checkpoint_config((dir / "ckpt").string()), streamed.saliency, o);
    // a Hugging Face directory out (float32 like its source), read back through import
    const auto cfg_out = nlohmann::json::parse(read_file((dir / "from_hf/config.json").string()));
    EXPECT_EQ(cfg_out["num_local_experts"], prune_only ? 2 : 4);
    EXPECT_EQ(cfg_out["model_type"], "mixtral");
    // an independent reader (the Python reference): names and shapes as config.json implies, and its logits
    const auto check = fmt::format("/usr/bin/python3 {}/tests/io/hf_reference.py --check {}", hf_fixture::source_dir(),
                                   (dir / "from_hf").string());
    ASSERT_EQ(std::system(check.c_str()), 0) << check;
    const auto ref = load_safetensors((dir / "from_hf/check.safetensors").string());
    {
      auto model = load_model((dir / "from_hf").string()).model;
      model->eval();
      torch::NoGradGuard g;
      const double diff = (model->forward(ref.at("ids")) - ref.at("logits")).abs().max().item<double>();
      EXPECT_LE(diff, 1e-4) << "max |logit difference| against the Python reference";
    }
    fs::remove(dir / "from_hf/check.safetensors");
    fs::remove_all(dir / "from_hf_ckpt");
    hf::import_hf((dir / "from_hf").string(), (dir / "from_hf_ckpt").string());
    const auto a = read_checkpoint((dir / "from_hf_ckpt").string()), b = read_checkpoint((dir / "from_ckpt").string());
    ASSERT_EQ(a.model.tensors.size(), b.model.tensors.size());
    for (auto& [name, t] : b.model.tensors) {
      ASSERT_TRUE(a.model.tensors.count(name)) << name;
      EXPECT_TRUE(torch::equal(a.model.tensors.at(name), t)) << name;
    }
    EXPECT_EQ(checkpoint_config((dir / "from_hf_ckpt").string()).model.moe.num_experts,
              in_memory.config.model.moe.num_experts);
    EXPECT_EQ(b.config_toml(), to_toml(in_memory.config));
    ASSERT_EQ(in_memory.tensors.size(), b.model.tensors.size());
    for (auto& [name, t] : in_memory.tensors) EXPECT_TRUE(torch::equal(b.model.tensors.at(name), t)) << name;
    EXPECT_EQ(streamed.surgery.layers.size(), in_memory.layers.size());
    EXPECT_EQ(streamed.surgery.layers[1].source, in_memory.layers[1].source);
    EXPECT_TRUE(fs::exists(dir / "from_hf/tokenizer.model"));
    EXPECT_TRUE(fs::exists(dir / "from_hf/umoe_report.json"));
    EXPECT_FALSE(fs::exists(dir / "from_hf.checkpoint-tmp"));
  }
  fs::remove_all(dir);
}
