// The decode engine (serve/decode_engine.h) against the modules: step by step its logits equal a
// float64 copy of the model decoding through the modules' KV cache, for every block shape it runs
// (dense SwiGLU/GELU, MoE with shared experts and their gate, expert biases, the three top-k
// routers with selection bias, renormalisation and gate scale, q/k norms, GQA, tied heads, bf16
// and int8 weights), with rows at different positions in one step; generation through it equals the
// modules' token for token; what it does not run is named and left to the modules. The decode
// stream (continuous batching): rows that join and leave between steps get generate()'s tokens.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/bf16.h"
#include "core/config.h"
#include "model/weight_dtype.h"
#include "serve/decode_engine.h"
#include "serve/decode_stream.h"
#include "serve/generate.h"
#include "test_support.h"

using namespace mf;

namespace {

std::vector<std::pair<std::string, ModelConfig>> engine_cases() {
  std::vector<std::pair<std::string, ModelConfig>> cases{
      {"MoE, shared expert and gate, q/k norm per head, biases", test::plain_moe()}};
  auto c = test::small_moe(96, 32, 2, 6, 3, 16);
  c.moe.router = RouterKind::SigmoidTopK;
  c.moe.bias_update = 1e-3;
  c.moe.renormalize = false;
  c.qk_norm = "full";
  c.n_heads = 4, c.n_kv_heads = 1;
  c.tie_embeddings = true;
  cases.emplace_back("sigmoid router with selection bias, no renormalisation, q/k norm over the projection, tied", c);
  c = test::small_moe(96, 32, 2, 8, 2, 16);
  c.moe.router = RouterKind::NormTopK;
  c.moe.gate_scale = 1.7;
  c.moe.activation = Activation::GELU;
  c.moe.expert_bias = true;
  cases.emplace_back("norm router with gate scale, GELU experts with biases", c);
  c = test::small_model(96, 32, 2, 4, 4);
  c.ffn = "gelu";
  c.o_bias = true;
  cases.emplace_back("dense GELU, output bias", c);
  c = test::small_moe(96, 96, 2, 4, 2, 64);  // rows of 64 and 96: int8 weights in whole chunks and a tail
  cases.emplace_back("MoE, d_model 96, experts of width 64", c);
  for (auto& [name, cfg] : cases) cfg.max_seq_len = 64;
  return cases;
}

// `m`'s weights (and buffers) in float64: the reference the engine is held to
TransformerLM float64_copy(TransformerLM& m) {
  TransformerLM ref(m->config());
  torch::NoGradGuard g;
  auto params = ref->named_parameters();
  for (auto& p : m->named_parameters()) params[p.key()].copy_(widened(p.value(), at::kFloat));
  auto buffers = ref->named_buffers();
  for (auto& b : m->named_buffers()) buffers[b.key()].copy_(b.value());
  ref->to(at::kDouble);
  ref->eval();
  return ref;
}

TransformerLM engine_model(const ModelConfig& c, at::ScalarType weights = at::kFloat) {
  TransformerLM m(c);
  m->init_weights(3);
  torch::NoGradGuard g;
  for (auto& b : m->named_buffers())  // a selection bias that matters
    if (b.key().find("selection_bias") != std::string::npos) b.value().normal_(0, 0.05);
  hold_weights(*m, weights);
  m->eval();
  return m;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST(DecodeEngine, LogitsEqualTheModulesInFloat64StepByStepWithRowsAtTheirOwnPositions) {
  const int threads = at::get_num_threads();
  for (const auto& [name, c] : engine_cases())
    for (int team : {1, 2})  // one thread, and threads sharing every product
      for (auto weights : {at::kFloat, at::kBFloat16, at::kChar}) {
        at::set_num_threads(team);
        SCOPED_TRACE(fmt::format("{}, {} weights, {} threads", name, weight_dtype_name(weights), team));
        auto m = engine_model(c, weights);
        ASSERT_EQ(DecodeEngine::unsupported(*m), "");
        auto ref = float64_copy(m);
        torch::NoGradGuard g;
        // row 0 starts from a 5-token prompt, row 1 from a 2-token one: different positions in every step
        const std::vector<std::vector<int64_t>> prompts = {{3, 14, 15, 92, 6}, {53, 5}};
        DecodeEngine engine(*m, 3);
        std::vector<std::vector<LayerCache>> ref_caches(2);
        for (int64_t r = 0; r < 2; ++r) {
          std::vector<LayerCache> caches;
          AuxLosses aux;
          auto ids = torch::tensor(prompts[r], torch::kLong).view({1, -1});
          m->forward(ids, aux, &caches);
          engine.load(2 - r, caches, 0);  // slots 2 and 1
          ref->forward(ids, aux, &ref_caches[r]);
          EXPECT_EQ(engine.length(2 - r), static_cast<int64_t>(prompts[r].size()));
        }
        for (int64_t t = 0; t < 6; ++t) {
          const std::vector<int64_t> tokens = {(7 * t + 1) % 96, (11 * t + 40) % 96};
          const auto got = engine.step({2, 1}, tokens);
          ASSERT_EQ(got.sizes(), (at::IntArrayRef{2, 96}));
          for (int64_t r = 0; r < 2; ++r) {
            AuxLosses aux;
            auto want = ref->forward(torch::tensor({tokens[r]}, torch::kLong).view({1, 1}), aux, &ref_caches[r]);
            EXPECT_LT(rel_diff(got[r], want.view({96})), 2e-5) << "row " << r << " step " << t;
          }
        }
        EXPECT_EQ(engine.length(2), 11);
        EXPECT_EQ(engine.length(0), 0);
      }
  at::set_num_threads(threads);
}

TEST(DecodeEngine, GenerationEqualsTheModulesTokenForToken) {
  for (const auto& [name, c] : engine_cases())
    for (auto weights : {at::kFloat, at::kChar}) {
      SCOPED_TRACE(name + ", " + weight_dtype_name(weights));
      auto m = engine_model(c, weights);
      SamplingOptions o;
      o.temperature = 0;
      o.max_tokens = 12;
      const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {9, 8, 7}, {40, 41, 42}};
      EXPECT_EQ(generate_batch(m, prompts, o, DecodePath::Engine), generate_batch(m, prompts, o, DecodePath::Modules));
    }
}

TEST(DecodeEngine, NamesWhatItDoesNotRunAndLeavesItToTheModules) {
  auto c = test::plain_moe();
  c.moe.capacity_factor = 1.0;
  TransformerLM capped(c);
  EXPECT_NE(DecodeEngine::unsupported(*capped).find("block 1: an expert capacity limit"), std::string::npos)
      << DecodeEngine::unsupported(*capped);
  SamplingOptions o;
  o.temperature = 0;
  o.max_tokens = 4;
  EXPECT_THROW(generate(capped, {1, 2}, o, DecodePath::Engine), ConfigError);
  EXPECT_EQ(generate(capped, {1, 2}, o).size(), 4u);  // Auto: the modules

  c = test::plain_moe();
  c.moe.router = RouterKind::TopP;
  EXPECT_NE(DecodeEngine::unsupported(*TransformerLM(c)).find("router"), std::string::npos);
  for (auto method : {"intb", "latent"}) {  // another FFN kind; an extension of the MoE slot
    Config cfg = load_config(test::source_dir() + "/configs/repro/" + method + ".toml");
    cfg.model.vocab_size = 96;
    EXPECT_NE(DecodeEngine::unsupported(*TransformerLM(cfg.model)), "") << method;
  }
  TransformerLM wide(test::plain_moe());
  wide->to(at::kDouble);
  EXPECT_NE(DecodeEngine::unsupported(*wide).find("Double"), std::string::npos) << DecodeEngine::unsupported(*wide);
}

TEST(DecodeEngine, RefusesUnknownSlotsTokensOutsideTheVocabularyTooManyRowsAndFullContexts) {
  auto c = test::plain_moe();
  c.max_seq_len = 4;
  auto m = engine_model(c);
  DecodeEngine engine(*m, 2);
  EXPECT_THROW(engine.step({2}, {1}), c10::Error);
  EXPECT_THROW(engine.step({0}, {96}), c10::Error);
  EXPECT_THROW(engine.step(std::vector<int64_t>(2 + DecodeEngine::kPrefillRows + 1, 0),
                           std::vector<int64_t>(2 + DecodeEngine::kPrefillRows + 1, 1)),
               c10::Error);
  EXPECT_THROW(engine.step({1, 1, 1, 1, 1}, {5, 5, 5, 5, 5}), c10::Error);  // positions 0..4 of a context of 4
  EXPECT_EQ(engine.length(1), 0);
  EXPECT_EQ(engine.step({1, 1, 1, 0}, {5, 6, 7, 8}).size(0), 2);  // one row of logits per slot
  engine.step({1}, {5});
  EXPECT_THROW(engine.step({1}, {5}), c10::Error);
  engine.clear(1);
  EXPECT_EQ(engine.step({1}, {5}).size(1), 96);
}

// A prompt in one step, in chunks, or token by token, alone or beside a decoding row: the same
// logits bit for bit (each row's sums run in one order whatever else the step holds), for weights
// in float32, bf16 and int8.
TEST(DecodeEngine, APromptInOneStepEqualsItTokenByTokenBitForBit) {
  for (auto weights : {at::kFloat, at::kBFloat16, at::kChar})
    for (int team : {1, 2}) {
      at::set_num_threads(team);
      SCOPED_TRACE(weight_dtype_name(weights));
      auto m = engine_model(test::plain_moe(), weights);
      const std::vector<int64_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
      DecodeEngine whole(*m, 2), single(*m, 2);
      const auto at_once = whole.prefill(0, prompt);
      at::Tensor one_by_one;
      for (auto t : prompt) one_by_one = single.step({1}, {t})[0];
      EXPECT_TRUE(at_once.equal(one_by_one)) << team << " threads";
      // continued: slot 1 of `whole` takes the prompt beside slot 0's next token
      const auto both = whole.step({0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {7, 3, 14, 15, 92, 65, 35, 89, 79, 32, 38});
      EXPECT_TRUE(both[1].equal(one_by_one)) << team << " threads";
      EXPECT_TRUE(both[0].equal(single.step({1}, {7})[0])) << team << " threads";
      EXPECT_EQ(whole.length(0), 11);
    }
  at::set_num_threads(2);
}

// Each thread computes its share of every product's outputs, shares that move with the thread
// count: the logits of every block shape are the same bit for bit whatever the thread count (an
// output's sums run in one order whichever thread and tile compute it)
TEST(DecodeEngine, LogitsDoNotDependOnTheThreadCount) {
  for (const auto& [name, cfg] : engine_cases())
    for (auto weights : {at::kFloat, at::kChar}) {
      auto m = engine_model(cfg, weights);
      std::vector<at::Tensor> first;
      for (int team : {1, 2, 3}) {
        at::set_num_threads(team);
        DecodeEngine e(*m, 2);
        std::vector<at::Tensor> logits = {e.prefill(0, {3, 14, 15, 92, 65}), e.step({0, 1, 1}, {35, 89, 79})};
        for (int i = 0; i < 3; ++i) logits.push_back(e.step({0, 1}, {7 + i, 11 + i}));
        for (size_t i = 0; i < first.size(); ++i)
          EXPECT_TRUE(logits[i].equal(first[i]))
              << name << ", " << weight_dtype_name(weights) << ": step " << i << ", " << team << " threads";
        if (first.empty()) first = logits;
      }
    }
  at::set_num_threads(2);
}

TEST(DecodeStream, RowsJoiningAndLeavingBetweenStepsEqualGenerateTokenForToken) {
  auto c = test::plain_moe();
  c.max_seq_len = 128;
  auto m = engine_model(c);
  struct Want {
    std::vector<int> prompt;
    SamplingOptions opt;
    int64_t joins_after;  // steps before it is added
  };
  std::vector<Want> wants;
  for (int r = 0; r < 6; ++r) {
    SamplingOptions o;
    o.max_tokens = 4 + 3 * r;
    o.temperature = r % 2 ? 0.9 : 0.0;
    o.seed = 100 + r;
    std::vector<int> prompt;
    for (int t = 0; t <= r % 4 + 1; ++t) prompt.push_back((13 * r + 5 * t + 2) % 96);
    wants.push_back({prompt, o, 2 * r});
  }
  wants[3].opt.max_tokens = 0;  // ends unread
  // beyond kPrefillRows: fed over several steps, sharing each step's room with the other's chunks
  for (int t = 0; t < 70; ++t) wants[2].prompt.push_back((3 * t) % 96);
  for (int t = 0; t < 100; ++t) wants[1].prompt.push_back((7 * t + 1) % 96);
  const auto free_run = generate(m, wants[4].prompt, wants[4].opt);
  wants[4].opt.stop_token = free_run.at(2);  // ends at its stop token
  std::vector<std::vector<int>> got(wants.size());
  DecodeStream stream(m, 3);
  std::vector<int64_t> ids(wants.size(), -1);
  std::vector<bool> ended(wants.size(), false);
  size_t next = 0;
  for (int64_t step = 0; next < wants.size() || !stream.empty(); ++step) {
    while (next < wants.size() && wants[next].joins_after <= step && stream.has_room()) {
      ids[next] = stream.add({wants[next].prompt, wants[next].opt, [&got, next](int id) {
                                got[next].push_back(id);
                                return next != 5 || got[next].size() < 3;  // row 5 hangs up after 3 tokens
                              }});
      ++next;
    }
    EXPECT_LE(stream.size(), 3);
    for (auto id : stream.step())
      for (size_t r = 0; r < wants.size(); ++r)
        if (ids[r] == id) ended[r] = true;
    ASSERT_LT(step, 200) << "the stream does not end";
  }
  for (size_t r = 0; r < wants.size(); ++r) {
    auto single = wants[r].opt;
    if (r == 5) single.max_tokens = 3;
    EXPECT_TRUE(ended[r]) << "row " << r;
    EXPECT_EQ(got[r], generate(m, wants[r].prompt, single)) << "row " << r;
  }
  EXPECT_TRUE(got[3].empty());
  EXPECT_EQ(got[5].size(), 3u);
  auto capped = test::plain_moe();
  capped.moe.capacity_factor = 1;
  EXPECT_THROW(DecodeStream(TransformerLM(capped), 2), ConfigError);
}
