// LatentMoE: the latent layer against its dense reference, accounting and the constant-cost
// solver, TwoNN on data of known dimension, Jacobian rank (../shared/specs/latentmoe.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "core/config.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "methods/latent/intrinsic_dim.h"
#include "methods/latent/jacobian_rank.h"
#include "methods/latent/latent.h"
#include "methods/latent/shape.h"
#include "methods/unipool/unipool.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "moe/dispatch.h"
#include "test_support.h"

using namespace mf;

namespace {

ModelConfig latent_model(const std::string& spec) {
  auto c = test::small_model(41, 16, 3);
  c.ffn = "moe";
  c.moe.layers = "1,2";
  c.moe.z_loss_coef = 0;
  c.moe.section<LatentConfig>().shapes = spec;
  return c;
}

at::Tensor param(torch::nn::Module& m, const std::string& name) { return m.named_parameters()[name]; }

}  // namespace

TEST(LatentMoE, LayerMatchesDenseReference) {
  torch::manual_seed(3);
  auto c = latent_model("8,6,5,2,12");
  MoEFeedForward f(c, 1, plan_moe(c));
  f.to(torch::kFloat64);
  for (auto& p : f.parameters()) {
    torch::NoGradGuard g;
    p.normal_(0, 0.3);
  }
  ASSERT_EQ(param(f, "latent_down.weight").sizes(), (std::vector<int64_t>{8, 16}));
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
      auto z = flat.matmul(param(f, "latent_down.weight").t());
      y = (dense_reference(z, r.assignment, *f.experts).matmul(param(f, "latent_up.weight").t()) +
           f.shared_experts->forward_unit(0, flat))
              .view(x.sizes());
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
  EXPECT_EQ(back.model.moe.section<LatentConfig>().shapes, c.moe.section<LatentConfig>().shapes);
  EXPECT_EQ(plan_moe(back.model).shapes.at(2).latent, 4);
  EXPECT_EQ(plan_moe(back.model).shapes.at(2).shared_hidden, 0);
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
  for (std::string spec : {"8,6,5,2,12", "16,6,5,2,0"}) {  // l = d: the model still builds both projections
    auto mc = latent_model(spec);
    MoEFeedForward f(mc, 1, plan_moe(mc));
    int64_t n = 0;
    for (auto& p : f.parameters()) n += p.numel();
    EXPECT_EQ(n, static_cast<int64_t>(latent_cost(16, parse_latent_shapes(spec)[0]).params)) << spec;
  }
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
  // the bound is on l/m only: 32/48 = 0.67 is within 0.4 of 1, 48/32 = 1.5 is not
  EXPECT_EQ(near_square_shapes(1536, 16, 0.4), (std::vector<std::pair<int64_t, int64_t>>{{32, 48}}));
}

TEST(LatentShape, SolverMeetsTargetsExactlyThenReportsRounding) {
  MoELayerShape ref{128, 128, 64, 4, 256};
  for (int64_t l : {64, 96, 192}) {
    auto s = solve_constant_cost(256, ref, l, 32);
    for (auto [a, t] :
         {std::pair{s.exact.P, s.target.P}, {s.exact.C, s.target.C}, {s.exact.V, s.target.V}, {s.exact.Q, s.target.Q}})
      EXPECT_NEAR(a / t, 1.0, 1e-12) << "l = " << l;
    EXPECT_DOUBLE_EQ(s.m, 128.0);       // m = C*/V*
    EXPECT_DOUBLE_EQ(s.K, 512.0 / l);   // K = V*/l
    EXPECT_DOUBLE_EQ(s.N, s.K * 16.0);  // N/K = P*/C*
    auto achieved = latent_cost(256, s.rounded);
    EXPECT_EQ(achieved.P, s.achieved.P);
    EXPECT_NEAR(s.max_abs_deviation(),
                std::max({std::abs(achieved.P / s.target.P - 1), std::abs(achieved.C / s.target.C - 1),
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

// Methods compose where their math allows: a UniPool pool of LatentMoE latent experts (one
// latent shape per pool group), NormRouter over latent experts; and refuse clearly otherwise.
namespace {
ModelConfig composed_model() {
  auto c = latent_model("8,16,4,2,0; 8,16,4,2,0; 12,8,6,1,16; 12,8,6,1,16");
  c.n_layers = 4;
  c.moe.layers = "all";
  c.moe.section<UniPoolConfig>().groups = 2;
  c.moe.section<UniPoolConfig>().aux_loss_coef = 0.01;
  c.moe.router = RouterKind::NormTopK;
  return c;
}

double train_steps(TransformerLM& m, int steps) {
  torch::manual_seed(0);
  auto tokens = torch::randint(0, 41, {4, 12}, torch::kLong);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2));
  double first = 0, last = 0;
  m->train();
  for (int i = 0; i < steps; ++i) {
    AuxLosses aux;
    auto logits = m->forward(tokens, aux);
    auto loss = lm_loss(logits, tokens);
    opt.zero_grad();
    (loss + aux.total()).backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  return first - last;
}
}  // namespace

TEST(Compose, UniPoolOfLatentExpertsTrains) {
  auto c = composed_model();
  TransformerLM m(c);
  m->init_weights(1);
  auto p = m->named_parameters();
  // group 0 (blocks 0, 1): l = 8, m = 16, pool 4 + 4; group 1 (blocks 2, 3): l = 12, m = 8, pool 6 + 6
  EXPECT_EQ(p["model.layers.0.mlp.experts.gate_up_proj"].sizes(), (std::vector<int64_t>{8, 32, 8}));
  EXPECT_EQ(p["model.layers.2.mlp.experts.gate_up_proj"].sizes(), (std::vector<int64_t>{12, 16, 12}));
  EXPECT_FALSE(p.contains("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_EQ(p["model.layers.1.mlp.latent_down.weight"].sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(p["model.layers.3.mlp.gate.weight"].sizes(), (std::vector<int64_t>{12, 16}));
  EXPECT_TRUE(p.contains("model.layers.3.mlp.shared_experts.down_proj"));
  auto layers = moe_layers(m->feed_forwards());
  EXPECT_EQ(layers[0]->experts.get(), layers[1]->experts.get());
  EXPECT_EQ(layers[2]->experts.get(), layers[3]->experts.get());
  const auto counts = m->param_counts();
  EXPECT_EQ(counts.expert_stored, counts.expert_vanilla);  // the default pool is the vanilla budget
  EXPECT_GT(train_steps(m, 40), 1.0);
  // the pool-level loss ran on the latent layers' NormRouter scores
  AuxLosses aux;
  m->forward(torch::randint(0, 41, {2, 6}, torch::kLong), aux);
  int pool_terms = 0;
  for (auto& [name, v] : aux.terms) pool_terms += name.find("pool_aux") != std::string::npos && v.item<double>() > 0;
  EXPECT_EQ(pool_terms, 4);
}

TEST(Compose, NormRouterOverLatentExpertsMatchesReference) {
  torch::manual_seed(7);
  auto c = latent_model("8,6,5,2,0");
  c.moe.router = RouterKind::NormTopK;
  MoEFeedForward f(c, 1, plan_moe(c));
  f.to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    for (auto& p : f.parameters()) p.normal_(0, 0.3);
  }
  auto x = torch::randn({9, 16}, torch::kFloat64);
  AuxLosses aux;
  auto y = f.forward(x, aux);
  auto r = f.gate->forward(x);
  auto z = x.matmul(param(f, "latent_down.weight").t());
  auto ref = dense_reference(z, r.assignment, *f.experts).matmul(param(f, "latent_up.weight").t());
  EXPECT_TRUE(torch::allclose(y, ref, 1e-10, 1e-12));
  TransformerLM m(c);
  m->init_weights(2);
  EXPECT_GT(train_steps(m, 40), 1.0);
}

TEST(Compose, ImpossibleCombinationsNameBothKeys) {
  const auto error = test::config_error;
  const auto mixed = error({"model.ffn=moe", "model.n_layers=4", "model.moe.unipool.groups=1",
                            "model.moe.latent.shapes=8,16,4,2,0; 8,16,4,2,0; 12,8,6,1,0; 12,8,6,1,0"});
  EXPECT_NE(mixed.find("model.moe.latent.shapes"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("model.moe.unipool.groups"), std::string::npos) << mixed;
  const auto shared = error({"model.ffn=moe", "model.moe.n_shared=1", "model.moe.latent.shapes=8,16,4,2,0"});
  EXPECT_NE(shared.find("model.moe.latent.shapes"), std::string::npos) << shared;
  EXPECT_NE(shared.find("model.moe.n_shared"), std::string::npos) << shared;
  // the old string key still loads
  Config old;
  apply_toml_text(old, "[model]\nffn = \"moe\"\n[model.moe]\nlatent = \"8,16,4,2,0\"\n", "old.toml");
  EXPECT_EQ(old.model.moe.section<LatentConfig>().shapes, "8,16,4,2,0");
}
