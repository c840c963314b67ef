// Weights held in bf16 or int8 (model/weight_dtype.h): a model computes what the float32 model
// computes on the same weights rounded to bf16 or to int8 blocks, for plain MoE blocks (routed and shared experts, a
// dense block, biases, q/k norms) and for every method's repro model (their own tensors stay float32), in a full
// forward pass and token by token through the KV cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/bf16.h"
#include "core/config.h"
#include "model/moe_ffn.h"
#include "model/weight_dtype.h"
#include "serve/generate.h"
#include "test_support.h"

using namespace mf;

namespace {

struct Pair {
  TransformerLM held{nullptr}, rounded{nullptr};  // bf16 or int8 weights; the float32 model on the same values
  HeldWeights counts;
};

Pair held_pair(const ModelConfig& c, at::ScalarType dtype = at::kBFloat16) {
  Pair p{TransformerLM(c), TransformerLM(c), {}};
  p.held->init_weights(5);
  p.rounded->init_weights(5);
  p.counts = hold_weights(*p.held, dtype);
  torch::NoGradGuard g;
  auto rounded = p.rounded->named_parameters();
  for (auto& w : p.held->named_parameters())
    if (w.value().scalar_type() == dtype) rounded[w.key()].copy_(widened(w.value(), at::kFloat));
  p.held->eval();
  p.rounded->eval();
  return p;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST(WeightDtype, HoldsTheLargeMatricesAndKeepsTheRest) {
  const auto p = held_pair(test::plain_moe());
  // embedding, head; per block q, k, v, o; the dense block's gate, up, down; two MoE blocks' routed and shared banks
  EXPECT_EQ(p.counts.tensors, 2 + 3 * 4 + 3 + 2 * (2 + 2));
  int64_t bf16 = 0, f32 = 0;
  for (auto& w : p.held->named_parameters()) {
    const bool held = w.value().scalar_type() == at::kBFloat16;
    (held ? bf16 : f32) += w.value().numel();
    if (w.key().find("norm") != std::string::npos || w.key().find("bias") != std::string::npos ||
        w.key().find(".gate.") != std::string::npos || w.key().find("shared_gate") != std::string::npos) {
      EXPECT_FALSE(held) << w.key() << " should stay float32";
    }
  }
  EXPECT_EQ(bf16, p.counts.parameters);
  EXPECT_EQ(f32, p.counts.kept);
  EXPECT_EQ(parse_weight_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_weight_dtype("int8"), at::kChar);
  EXPECT_EQ(weight_dtype_name(at::kChar), "int8");
  EXPECT_THROW(parse_weight_dtype("f16"), ConfigError);
}

TEST(WeightDtype, Int8HoldsTheMatricesWhoseRowsAreWholeBlocks) {
  const auto bf16 = held_pair(test::plain_moe());
  const auto int8 = held_pair(test::plain_moe(), at::kChar);
  auto in_bf16 = bf16.held->named_parameters();
  int64_t held = 0;
  for (auto& w : int8.held->named_parameters()) {
    const bool q8 = w.value().scalar_type() == at::kChar;
    const bool could = in_bf16[w.key()].scalar_type() == at::kBFloat16;
    // held: what bf16 holds, where rows are whole blocks of 32 (d_model 32: embedding, head, q/k/v/o,
    // gate/up products; not the experts' down products, rows of width 24)
    EXPECT_EQ(q8, could && w.value().size(-1) % kQ8Block == 0) << w.key();
    EXPECT_EQ(q8, !w.value().requires_grad()) << w.key() << ": int8 weights take no gradient";
    if (q8) held += w.value().numel();
  }
  EXPECT_EQ(held, int8.counts.parameters);
  EXPECT_GT(int8.counts.tensors, 2 + 3 * 4);
  EXPECT_LT(int8.counts.tensors, bf16.counts.tensors);  // the experts' down products (width 24) stay float32
}

TEST(WeightDtype, LogitsEqualTheFloat32ModelOnRoundedWeights) {
  std::vector<std::pair<std::string, ModelConfig>> cases{{"plain MoE", test::plain_moe()}};
  auto dense = test::small_model(96, 32, 2);
  dense.tie_embeddings = true;
  cases.emplace_back("dense, tied head", dense);
  for (auto name : {"latent", "unipool", "unif-lm", "umoe", "intb"}) {
    Config cfg = load_config(test::source_dir() + "/configs/repro/" + name + ".toml");
    cfg.model.vocab_size = 96;
    cases.emplace_back(name, cfg.model);
  }
  const auto tokens = torch::randint(0, 96, {2, 11}, torch::kLong);
  for (auto& [name_only, c] : cases)
    for (auto dtype : {at::kBFloat16, at::kChar}) {
      const auto name = name_only + ", " + weight_dtype_name(dtype);
      auto p = held_pair(c, dtype);
      EXPECT_GT(p.counts.tensors, 0) << name;
      torch::NoGradGuard g;
      const auto want = p.rounded->forward(tokens);
      EXPECT_LT(rel_diff(p.held->forward(tokens), want), 2e-5) << name;
      // token by token through the KV cache (the decode shape: one row per step)
      std::vector<LayerCache> cache;
      std::vector<at::Tensor> steps;
      for (int64_t t = 0; t < tokens.size(1); ++t) {
        AuxLosses aux;
        steps.push_back(p.held->forward(tokens.narrow(1, t, 1), aux, &cache));
      }
      EXPECT_LT(rel_diff(torch::cat(steps, 1), want), 2e-5) << name << ", decoding";
    }
}

TEST(WeightDtype, GreedyGenerationEqualsTheFloat32ModelOnRoundedWeights) {
  auto p = held_pair(test::plain_moe());
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 20;
  EXPECT_EQ(generate(p.held, {3, 1, 4, 1, 5}, greedy), generate(p.rounded, {3, 1, 4, 1, 5}, greedy));
}
