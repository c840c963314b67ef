// LatentMoE: the latent layer against its dense reference, accounting and the constant-cost
// solver, TwoNN on data of known dimension, Jacobian rank (../shared/specs/latentmoe.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "analysis/intrinsic_dim.h"
#include "analysis/jacobian_rank.h"
#include "core/config.h"
#include "io/safetensors.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "moe/dispatch.h"
#include "moe/latent_shape.h"
#include "train/optim.h"

using namespace mf;

namespace {

ModelConfig latent_model(const std::string& spec) {
  ModelConfig c;
  c.vocab_size = 41, c.d_model = 16, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.ffn = "moe";
  c.moe.layers = "1,2", c.moe.latent = spec, c.moe.z_loss_coef = 0;
  return c;
}

}  // namespace

TEST(LatentMoE, LayerMatchesDenseReference) {
  torch::manual_seed(3);
  auto c = latent_model("8,6,5,2,12");
  MoEFeedForward f(c, 1);
  f.to(torch::kFloat64);
  for (auto& p : f.parameters()) {
    torch::NoGradGuard g;
    p.normal_(0, 0.3);
  }
  ASSERT_EQ(f.latent_down->weight.sizes(), (std::vector<int64_t>{8, 16}));
  ASSERT_EQ(f.experts->gate_up_proj.sizes(), (std::vector<int64_t>{5, 12, 8}));
  ASSERT_EQ(f.shared_experts->down_proj.sizes(), (std::vector<int64_t>{1, 16, 12}));
  auto x = torch::randn({2, 7, 16}, torch::kFloat64);
  auto run = [&](bool fast) {
    auto xi = x.clone().requires_grad_(true);
    for (auto& p : f.parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor y;
    if (fast) {
      AuxLosses aux;
      y = f.forward(xi, aux);
    } else {  // y = W_up sum_i p_i E_i(W_down x) + S(x), every expert on every token
      auto flat = xi.reshape({-1, 16});
      auto r = f.gate->forward(flat);
      auto z = flat.matmul(f.latent_down->weight.t());
      y = (dense_reference(z, r.assignment, *f.experts).matmul(f.latent_up->weight.t()) +
           f.shared_experts->forward_unit(0, flat)).view(x.sizes());
    }
    (y * y.detach().cos()).sum().backward();
    std::vector<at::Tensor> out = {y.detach(), xi.grad()};
    for (auto& p : f.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros({1}));
    return out;
  };
  auto fast = run(true), ref = run(false);
  ASSERT_EQ(fast.size(), ref.size());
  for (size_t i = 0; i < fast.size(); ++i) EXPECT_TRUE(torch::allclose(fast[i], ref[i], 1e-10, 1e-12)) << i;
}

TEST(LatentMoE, HeterogeneousShapesRoundTripThroughCheckpoints) {
  auto c = latent_model("8,6,5,2,12; 4,12,3,1,0");
  Config full;
  full.model = c;
  Config back;
  apply_toml_text(back, to_toml(full), "round trip");
  back.model.vocab_size = c.vocab_size;  // from the tokenizer, not the config
  EXPECT_EQ(back.model.moe.latent, c.moe.latent);
  EXPECT_EQ(moe_layer_shape(back.model, 2).latent, 4);
  EXPECT_EQ(moe_layer_shape(back.model, 2).shared_hidden, 0);
  TransformerLM a(c);
  a->init_weights(5);
  auto path = (std::filesystem::temp_directory_path() / "mf_latent_roundtrip.safetensors").string();
  save_safetensors(path, model_tensors(*a));
  TransformerLM b(back.model);
  load_model_tensors(*b, load_safetensors(path));
  EXPECT_EQ(b->named_parameters()["model.layers.2.mlp.latent_up.weight"].sizes(), (std::vector<int64_t>{16, 4}));
  auto tokens = torch::randint(0, 41, {2, 6}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens)));
  std::filesystem::remove(path);
  EXPECT_THROW(parse_latent_shapes("8,6,5,7,1"), ConfigError);  // K > N
  Config bad;
  bad.model = latent_model("8,6,5,2,1; 8,6,5,2,1; 8,6,5,2,1");  // 3 entries for 2 MoE layers
  EXPECT_THROW(validate(bad), ConfigError);
}

TEST(LatentShape, AccountingHandComputedAndMatchesModel) {
  MoELayerShape s{4, 6, 5, 2, 3};
  auto c = latent_cost(8, s);
  EXPECT_EQ(c.P, 120);  // N l m
  EXPECT_EQ(c.C, 48);   // K l m
  EXPECT_EQ(c.V, 8);    // K l
  EXPECT_EQ(c.Q, 22);   // 2 l + N + 3 ms
  EXPECT_EQ(c.params, 3 * 120 + 8 * 22);
  auto m = latent_model("8,6,5,2,12");
  MoEFeedForward f(m, 1);
  int64_t n = 0;
  for (auto& p : f.parameters()) n += p.numel();
  EXPECT_EQ(n, static_cast<int64_t>(latent_cost(16, {8, 6, 5, 2, 12}).params));
  // accuracy-oriented scaling keeps P, C, V of the uncompressed layer
  MoELayerShape full{0, 6, 5, 2, 0};
  auto scaled = scale_for_accuracy(16, full, 4);
  EXPECT_EQ(scaled.latent, 4);
  EXPECT_EQ(scaled.num_experts, 20);
  EXPECT_EQ(scaled.top_k, 8);
  EXPECT_EQ(latent_cost(16, scaled).P, latent_cost(16, full).P);
  EXPECT_EQ(latent_cost(16, scaled).C, latent_cost(16, full).C);
  EXPECT_EQ(latent_cost(16, scaled).V, latent_cost(16, full).V);
  auto sq = near_square_shapes(4096, 16, 0.4);
  ASSERT_FALSE(sq.empty());
  EXPECT_EQ(sq[0], (std::pair<int64_t, int64_t>{64, 64}));
  for (auto& [l, mm] : sq) EXPECT_EQ(l * mm, 4096);
}

TEST(LatentShape, SolverMeetsTargetsExactlyThenReportsRounding) {
  MoELayerShape ref{128, 128, 64, 4, 256};
  for (int64_t l : {64, 96, 192}) {
    auto s = solve_constant_cost(256, ref, l, 32);
    for (auto [a, t] : {std::pair{s.exact.P, s.target.P}, {s.exact.C, s.target.C}, {s.exact.V, s.target.V},
                        {s.exact.Q, s.target.Q}})
      EXPECT_NEAR(a / t, 1.0, 1e-12) << "l = " << l;
    EXPECT_DOUBLE_EQ(s.m, 128.0);       // m = C*/V*
    EXPECT_DOUBLE_EQ(s.K, 512.0 / l);   // K = V*/l
    EXPECT_DOUBLE_EQ(s.N, s.K * 16.0);  // N/K = P*/C*
    auto achieved = latent_cost(256, s.rounded);
    EXPECT_EQ(achieved.P, s.achieved.P);
    EXPECT_NEAR(s.max_abs_deviation(), std::max({std::abs(achieved.P / s.target.P - 1), std::abs(achieved.C / s.target.C - 1),
                                                 std::abs(achieved.V / s.target.V - 1), std::abs(achieved.Q / s.target.Q - 1)}),
                1e-15);
    EXPECT_EQ(s.rounded.expert_hidden % 32, 0);
    EXPECT_GE(s.rounded.num_experts, s.rounded.top_k);
  }
  // l = 64: m, K, N come out whole, so P, C, V are met exactly; ms = 277.3 rounds to 288 (Q +2.9 %)
  auto s64 = solve_constant_cost(256, ref, 64, 32);
  EXPECT_EQ(s64.achieved.P, s64.target.P);
  EXPECT_EQ(s64.achieved.C, s64.target.C);
  EXPECT_EQ(s64.achieved.V, s64.target.V);
  EXPECT_EQ(s64.rounded.shared_hidden, 288);
  EXPECT_NEAR(s64.max_abs_deviation(), (64 * 2 + 128 + 3 * 288) / 1088.0 - 1, 1e-12);
  // l = 96: K = 5.33 rounds to 5, which the report shows
  EXPECT_GT(solve_constant_cost(256, ref, 96, 32).max_abs_deviation(), 0.01);
}

TEST(TwoNN, LinearlyEmbeddedGaussiansAndSwissRoll) {
  torch::manual_seed(0);
  for (int64_t dim : {2, 5, 8}) {
    auto z = torch::randn({2500, dim}, torch::kFloat64);
    auto X = z.matmul(torch::randn({dim, 64}, torch::kFloat64));
    EXPECT_NEAR(twonn_dimension(X), static_cast<double>(dim), 0.12 * dim) << dim;
  }
  auto t = 1.5 * M_PI * (1 + 2 * torch::rand({3000}, torch::kFloat64)), h = 20 * torch::rand({3000}, torch::kFloat64);
  auto roll = torch::stack({t * t.cos(), h, t * t.sin()}, 1);
  EXPECT_NEAR(twonn_dimension(roll), 2.0, 0.25);
  // duplicated points (r1 = 0) are dropped, not divided by
  auto z = torch::randn({1500, 4}, torch::kFloat64);
  auto dup = torch::cat({z, z.narrow(0, 0, 500)});
  const double d = twonn_dimension(dup);
  EXPECT_TRUE(std::isfinite(d));
  EXPECT_NEAR(d, 4.0, 0.6);
}

TEST(TwoNN, TwoSegmentSplit) {
  EXPECT_EQ(two_segment_split({3, 4, 9, 10, 8}), 2);     // max(3,4) < min(9,10,8); gap 4
  EXPECT_EQ(two_segment_split({5, 4, 3}), -1);           // decreasing: no valid split
  EXPECT_EQ(two_segment_split({1, 2, 3, 4}), 1);         // every split valid, all gaps 1: first
  EXPECT_EQ(two_segment_split({1, 1.5, 6, 6.5, 7}), 2);  // the largest gap
}

TEST(JacobianRank, FormulaMatchesAutogradAndRankIsMinLM) {
  torch::manual_seed(1);
  for (auto [l, m] : {std::pair<int64_t, int64_t>{8, 5}, {6, 12}, {7, 7}}) {
    ExpertBank bank(2, l, m);
    bank.to(torch::kFloat64);
    auto z = torch::randn({l}, torch::kFloat64).requires_grad_(true);
    auto J = expert_jacobian(bank, 1, z.detach());
    for (int64_t i = 0; i < l; ++i) {  // row i of J = d y_i / d z
      auto y = bank.forward_unit(1, z.unsqueeze(0)).squeeze(0);
      auto gi = torch::autograd::grad({y[i]}, {z})[0];
      EXPECT_TRUE(torch::allclose(J[i], gi, 1e-10, 1e-12));
    }
    EXPECT_EQ(numerical_rank(J, 1e-6), std::min(l, m));
    EXPECT_LE(numerical_rank(J, 1e-12), std::min(l, m));
  }
  ExpertBank low(1, 6, 3);  // W_o of rank 1 caps the rank
  {
    torch::NoGradGuard g;
    low.down_proj.copy_(torch::randn({1, 6, 1}).matmul(torch::randn({1, 1, 3})));
  }
  EXPECT_EQ(numerical_rank(expert_jacobian(low, 0, torch::randn({6})), 1e-5), 1);
}
