// MoE engine: routers, dispatch against the dense reference (outputs and gradients in
// float64), invariances and hand-computed losses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "model/layers.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "moe/combine.h"
#include "moe/dispatch.h"
#include "moe/fast_vs_reference.h"
#include "moe/routers.h"
#include "test_support.h"

using namespace mf;

namespace {

Router topk_router(int64_t d, int64_t E, int64_t k) {
  RouterOptions o;
  o.num_experts = E;
  o.top_k = k;
  return Router(d, o);
}

struct Case {
  std::string router;
  int64_t T, d, E, k, F;
};

// Output and gradients (x, expert weights, router weight) of both training paths vs the dense reference.
void expect_matches_reference(const Case& c, const at::Tensor& x_in) {
  RouterOptions o;
  o.kind = parse_router_kind(c.router);
  o.num_experts = c.E;
  o.top_k = c.k;
  o.top_p = 0.6;
  o.seed = 3;
  auto router_weight = torch::randn({c.E, c.d}, torch::kFloat64);
  ExpertBank bank(c.E, c.d, c.F);
  bank.to(torch::kFloat64);
  auto run = [&](bool fast) {
    Router router(c.d, o);  // fresh per run: the uniform_random router draws anew on every call
    router->to(torch::kFloat64);
    {
      torch::NoGradGuard g;
      router->weight.copy_(router_weight);
    }
    for (auto& p : bank.parameters()) p.mutable_grad() = at::Tensor();
    // the router's gradient stays undefined where the routing has no gradient path (random, balanced)
    return test::output_and_grads(
        [&](const at::Tensor& x) {
          auto r = router->forward(x);
          return fast ? dispatch(x, r.assignment, bank).y_TD : dense_reference(x, r.assignment, bank);
        },
        x_in,
        [&] {
          return std::vector<at::Tensor>{bank.gate_up_proj.grad(), bank.down_proj.grad(), router->weight.grad()};
        });
  };
  const auto ref = run(false);
  force_units_path(UnitsPath::Grouped);  // the path banks without a combined one take
  const auto grouped = run(true);
  force_units_path(std::nullopt);
  const auto fast = run(true);  // the combined path (moe/combined_ffn.h)
  const bool learned = c.router != "uniform_random" && c.router != "balanced";
  EXPECT_EQ(fast[4].defined(), learned) << c.router << ": the router's gradient (fast path)";
  EXPECT_EQ(ref[4].defined(), learned) << c.router << ": the router's gradient (reference)";
  // A renormalised single pick weighs 1 whatever the router says (top-1; top-p keeping one
  // expert), so the router's gradient is legitimately 0 there; everything else must not be.
  const bool router_grad = learned && c.k > 1 && c.router != "top_p";
  for (size_t i = 0; i < (router_grad ? 5u : 4u); ++i)
    EXPECT_GT(ref[i].abs().max().item<double>(), 1e-6)
        << c.router << " T=" << c.T << " k=" << c.k << ": entry " << i << " is zero (a vacuous match)";
  for (const auto& [path, got] : {std::pair{"combined", fast}, std::pair{"grouped", grouped}})
    test::expect_close(got, ref, {"output", "grad x", "grad gate_up", "grad down", "grad router"},
                       fmt::format("{} T={} E={} k={} ({} path)", c.router, c.T, c.E, c.k, path));
}

}  // namespace

TEST(Dispatch, MatchesDenseReferenceForEveryRouter) {
  torch::manual_seed(0);
  for (std::string router : {"softmax_topk", "sigmoid_topk", "norm_topk", "top_p", "uniform_random", "balanced"})
    for (Case c : {Case{router, 13, 8, 4, 2, 6}, Case{router, 7, 6, 16, 3, 5} /* many empty experts */,
                   Case{router, 9, 5, 3, 3, 4} /* k = E */, Case{router, 1, 4, 5, 1, 3}})
      expect_matches_reference(c, torch::randn({c.T, c.d}, torch::kFloat64));
}

TEST(Dispatch, GeluExpertsWithBiasesMatchReference) {
  torch::manual_seed(5);
  for (std::string act : {"gelu", "swiglu"}) {
    ExpertBank bank(5, 6, 7, parse_activation(act), /*bias=*/true);
    bank.to(torch::kFloat64);
    {
      torch::NoGradGuard g;
      bank.gate_up_proj_bias.normal_(), bank.down_proj_bias.normal_();
    }
    RouterOptions o;
    o.num_experts = 5;
    o.top_k = 2;
    Router r(6, o);
    r->to(torch::kFloat64);
    auto x = torch::randn({9, 6}, torch::kFloat64);
    auto run = [&](bool fast) {
      for (auto& p : bank.parameters()) p.mutable_grad() = at::Tensor();
      return test::output_and_grads(
          [&](const at::Tensor& x) {
            auto a = r->forward(x).assignment;
            return fast ? dispatch(x, a, bank).y_TD : dense_reference(x, a, bank);
          },
          x, [&] { return bank.parameters(); });
    };
    test::expect_close(run(true), run(false),
                       {"output", "grad x", "grad gate_up", "grad down", "grad gate_up bias", "grad down bias"}, act);
  }
}

TEST(Dispatch, TiesAndZeroWeightsMatchReference) {
  torch::manual_seed(1);
  auto row = torch::randn({1, 6}, torch::kFloat64);
  auto x = torch::cat({row.repeat({5, 1}), torch::zeros({3, 6}, torch::kFloat64)});  // identical rows, zero rows
  for (std::string router : {"softmax_topk", "top_p"}) expect_matches_reference({router, 8, 6, 4, 2, 5}, x);
  // explicit zero combine weights
  ExpertBank bank(3, 4, 5);
  bank.to(torch::kFloat64);
  Assignment a{torch::tensor({0, 0, 1, 2}, torch::kLong), torch::tensor({2, 0, 2, 1}, torch::kLong),
               torch::tensor({0.0, 0.5, 0.0, 1.5}, torch::kFloat64), 3, 3};
  auto xs = torch::randn({3, 4}, torch::kFloat64);
  EXPECT_TRUE(torch::allclose(dispatch(xs, a, bank).y_TD, dense_reference(xs, a, bank), 1e-12, 1e-12));
  EXPECT_TRUE(torch::equal(dispatch(xs, a, bank).y_TD[1], torch::zeros({4}, torch::kFloat64)));
}

TEST(Dispatch, OneExpertTopOneEqualsDenseSwiGLU) {
  ExpertBank bank(1, 6, 10);
  SwiGLU dense(6, 10);
  bank.to(torch::kFloat64), dense.to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    bank.gate_up_proj[0].copy_(torch::cat({dense.gate_proj->weight, dense.up_proj->weight}));
    bank.down_proj[0].copy_(dense.down_proj->weight);
  }
  RouterOptions o;
  o.num_experts = 1;
  o.top_k = 1;
  Router r(6, o);
  r->to(torch::kFloat64);
  auto x = torch::randn({11, 6}, torch::kFloat64);
  AuxLosses aux;
  auto routed = r->forward(x);
  EXPECT_TRUE(torch::allclose(dispatch(x, routed.assignment, bank).y_TD, dense.forward(x, aux), 1e-12, 1e-12));
}

TEST(Dispatch, CapacityInfinityIsDroplessAndSmallCapacityDrops) {
  torch::manual_seed(2);
  auto r = topk_router(6, 4, 2);
  ExpertBank bank(4, 6, 8);
  auto x = torch::randn({32, 6});
  auto routed = r->forward(x);
  auto dropless = dispatch(x, routed.assignment, bank);
  auto huge = dispatch(x, routed.assignment, bank, {1000.0});
  EXPECT_TRUE(torch::equal(dropless.y_TD, huge.y_TD));
  EXPECT_EQ(huge.dropped.item<int64_t>(), 0);
  auto tight = dispatch(x, routed.assignment, bank, {0.5});  // cap = ceil(0.5 * 64 / 4) = 8 per expert
  auto load = read_routing(tally_routing(routed)).load;
  int64_t expect_dropped = 0;
  for (auto l : load) expect_dropped += std::max<int64_t>(0, l - 8);
  EXPECT_EQ(tight.dropped.item<int64_t>(), expect_dropped);
  EXPECT_GT(tight.dropped.item<int64_t>(), 0);
}

TEST(Dispatch, RepeatedForwardIsBitwiseIdentical) {
  torch::manual_seed(4);
  auto r = topk_router(16, 8, 2);
  ExpertBank bank(8, 16, 24);
  auto x = torch::randn({64, 16});
  auto first = dispatch(x, r->forward(x).assignment, bank).y_TD;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(first, dispatch(x, r->forward(x).assignment, bank).y_TD));
}

TEST(Combine, MatchesScaledIndexAddInOutputAndGradients) {
  torch::manual_seed(6);
  // repeated tokens, a token with no pair, D wider than one thread's column chunk, and no pairs at all
  for (auto [P, T, D] : std::vector<std::array<int64_t, 3>>{{9, 5, 3}, {40, 7, 150}, {0, 4, 6}}) {
    auto token = torch::randint(0, T - 1, {P}, torch::kLong);  // token T - 1 gets nothing
    auto out = torch::randn({P, D}, torch::kFloat64).requires_grad_(true);
    auto weight = torch::rand({P}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({T, D}, torch::kFloat64);
    auto fast = combine(out, token, weight, T);
    auto ref = torch::zeros({T, D}, torch::kFloat64).index_add(0, token, out * weight.unsqueeze(1));
    auto fast_grads = torch::autograd::grad({(fast * up).sum()}, {out, weight});
    auto ref_grads = torch::autograd::grad({(ref * up).sum()}, {out, weight});
    EXPECT_TRUE(torch::allclose(fast, ref, 1e-12, 1e-12)) << "P=" << P << " D=" << D;
    EXPECT_TRUE(torch::equal(fast[T - 1], torch::zeros({D}, torch::kFloat64)));
    for (size_t i = 0; i < 2; ++i)
      EXPECT_TRUE(torch::allclose(fast_grads[i], ref_grads[i], 1e-12, 1e-12))
          << "P=" << P << " D=" << D << " grad " << i;
  }
}

TEST(Combine, GatherRowsMatchesIndexSelectInOutputAndGradients) {
  torch::manual_seed(7);
  for (auto [P, T, D] : std::vector<std::array<int64_t, 3>>{{9, 5, 3}, {300, 7, 150}, {0, 4, 6}}) {
    auto token = torch::randint(0, T - 1, {P}, torch::kLong);  // repeats; token T - 1 is never read
    auto x = torch::randn({T, D}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({P, D}, torch::kFloat64);
    auto fast = gather_rows(x, token);
    auto ref = x.index_select(0, token);
    EXPECT_TRUE(torch::equal(fast, ref)) << "P=" << P;
    auto fast_grad = torch::autograd::grad({(fast * up).sum()}, {x})[0];
    auto ref_grad = torch::autograd::grad({(ref * up).sum()}, {x})[0];
    EXPECT_TRUE(torch::allclose(fast_grad, ref_grad, 1e-12, 1e-12)) << "P=" << P;
    EXPECT_TRUE(torch::equal(fast_grad[T - 1], torch::zeros({D}, torch::kFloat64)));
  }
}

TEST(Losses, SwitchAuxIsAlphaAtUniformRouting) {
  // uniform probabilities and perfectly even assignment: f_i = P_i = 1/E -> alpha * E * E / E^2 = alpha
  auto probs = torch::full({8, 4}, 0.25, torch::kFloat64);
  auto unit = torch::tensor({0, 1, 2, 3, 0, 1, 2, 3}, torch::kLong);
  EXPECT_NEAR(switch_aux_loss(probs, unit, 4, 0.01).item<double>(), 0.01, 1e-15);
}

TEST(Losses, SwitchAuxWorkedExample) {
  // T=2, E=2, k=1: p = [[0.8, 0.2], [0.4, 0.6]] -> P = [0.6, 0.4]; both tokens to expert 0 -> f = [1, 0]
  // L = alpha * 2 * (1 * 0.6 + 0 * 0.4) = 1.2 alpha
  auto probs = torch::tensor({0.8, 0.2, 0.4, 0.6}, torch::kFloat64).view({2, 2});
  EXPECT_NEAR(switch_aux_loss(probs, torch::tensor({0, 0}, torch::kLong), 2, 0.5).item<double>(), 0.6, 1e-15);
}

TEST(Losses, SequenceAuxIsAlphaAtUniformAndPerSequence) {
  // 2 sequences of 4 tokens, E = 2, k = 1, uniform probabilities, even load per sequence -> alpha
  auto probs = torch::full({8, 2}, 0.5, torch::kFloat64);
  auto token = torch::arange(8, torch::kLong);
  EXPECT_NEAR(
      sequence_aux_loss(probs, token, torch::tensor({0, 1, 0, 1, 1, 0, 1, 0}, torch::kLong), 4, 1, 0.1).item<double>(),
      0.1, 1e-15);
  // sequence 0 all to expert 0, sequence 1 all to expert 1: per sequence f = (2, 0) / (0, 2), P = 0.5 -> 1 each
  // (the batch-wide Switch loss would see an even split and also give alpha; a skewed P separates them)
  auto skew = torch::tensor({0.9, 0.1}, torch::kFloat64).repeat({8, 1});
  auto unit = torch::tensor({0, 0, 0, 0, 1, 1, 1, 1}, torch::kLong);
  // seq 0: f = (2, 0), P = (0.9, 0.1) -> 1.8; seq 1: f = (0, 2) -> 0.2; mean 1.0
  EXPECT_NEAR(sequence_aux_loss(skew, token, unit, 4, 1, 1.0).item<double>(), 1.0, 1e-12);
  EXPECT_NEAR(sequence_aux_loss(skew, token, torch::zeros({8}, torch::kLong), 4, 1, 1.0).item<double>(), 1.8, 1e-12);
}

TEST(Losses, ZLossHandComputed) {
  // logsumexp([0, 0]) = ln 2; logsumexp([ln 3, 0]) = ln 4
  auto z = torch::tensor({0.0, 0.0, std::log(3.0), 0.0}, torch::kFloat64).view({2, 2});
  double expect = 1e-3 * (std::pow(std::log(2.0), 2) + std::pow(std::log(4.0), 2)) / 2;
  EXPECT_NEAR(router_z_loss(z, 1e-3).item<double>(), expect, 1e-15);
}

TEST(Routers, TopPPrefixLengths) {
  auto p = torch::tensor({0.5, 0.3, 0.2, 0.1, 0.2, 0.7, 0.25, 0.25, 0.5}, torch::kFloat64).view({3, 3});
  auto n = top_p_counts(p, 0.6);
  EXPECT_EQ(n[0].item<int64_t>(), 2);  // 0.5 < 0.6, 0.5 + 0.3 >= 0.6
  EXPECT_EQ(n[1].item<int64_t>(), 1);  // 0.7 >= 0.6
  EXPECT_EQ(n[2].item<int64_t>(), 2);  // 0.5, then 0.25
  EXPECT_EQ(top_p_counts(p, 1.0)[0].item<int64_t>(), 3);
}

TEST(Routers, TopPExactBoundaryIsExclusive) {
  // masses ahead of each sorted entry: 0, 0.5, 0.75 (all exact in binary). An entry is taken
  // while the mass strictly ahead of it is below the threshold.
  auto p = torch::tensor({0.25, 0.5, 0.25}, torch::kFloat64).view({1, 3});
  EXPECT_EQ(top_p_counts(p, 0.5)[0].item<int64_t>(), 1);
  EXPECT_EQ(top_p_counts(p, 0.75)[0].item<int64_t>(), 2);
  EXPECT_EQ(top_p_counts(p, 0.7500001)[0].item<int64_t>(), 3);
}

TEST(Losses, SequenceAuxWithTwoUnitsPerToken) {
  // E = 3, K = 2, one sequence of L = 2 tokens: token 0 -> {0, 1}, token 1 -> {0, 2}; counts (2, 1, 1),
  // f = E / (K L) * counts = (1.5, 0.75, 0.75); P = mean of (0.5, 0.3, 0.2), (0.4, 0.1, 0.5) = (0.45, 0.2, 0.35)
  // L = 1.5 * 0.45 + 0.75 * 0.2 + 0.75 * 0.35 = 1.0875
  auto probs = torch::tensor({0.5, 0.3, 0.2, 0.4, 0.1, 0.5}, torch::kFloat64).view({2, 3});
  auto token = torch::tensor({0, 0, 1, 1}, torch::kLong), unit = torch::tensor({0, 1, 0, 2}, torch::kLong);
  EXPECT_NEAR(sequence_aux_loss(probs, token, unit, 2, 2, 1.0).item<double>(), 1.0875, 1e-12);
}

namespace {
// One token whose logits are (0, 1, -2): x = [1], W_r = [[0], [1], [-2]].
RouterOutput route_fixed_logits(RouterKind kind, bool renormalize, double top_p = 0.5) {
  RouterOptions o;
  o.kind = kind;
  o.num_experts = 3;
  o.top_k = 2;
  o.renormalize = renormalize;
  o.top_p = top_p;
  Router r(1, o);
  r->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    r->weight.copy_(torch::tensor({0.0, 1.0, -2.0}, torch::kFloat64).view({3, 1}));
  }
  return r->forward(torch::ones({1, 1}, torch::kFloat64));
}
}  // namespace

TEST(Routers, SigmoidWeightsHandComputed) {
  const double s0 = 1 / (1 + std::exp(0.0)), s1 = 1 / (1 + std::exp(-1.0));  // 0.5, 0.7311
  auto raw = route_fixed_logits(RouterKind::SigmoidTopK, false).assignment;
  EXPECT_EQ(raw.unit_P[0].item<int64_t>(), 1);
  EXPECT_EQ(raw.unit_P[1].item<int64_t>(), 0);
  EXPECT_NEAR(raw.weight_P[0].item<double>(), s1, 1e-15);
  EXPECT_NEAR(raw.weight_P[1].item<double>(), s0, 1e-15);
  auto renorm = route_fixed_logits(RouterKind::SigmoidTopK, true).assignment;
  EXPECT_NEAR(renorm.weight_P[0].item<double>(), s1 / (s0 + s1), 1e-15);
  EXPECT_NEAR(renorm.weight_P[1].item<double>(), s0 / (s0 + s1), 1e-15);
}

TEST(Routers, TopPWeightsHandComputed) {
  // softmax(0, 1, -2) = (1, e, e^-2) / (1 + e + e^-2) = (0.2595, 0.7054, 0.0351); threshold 0.8 keeps
  // units 1 and 0 (mass ahead of the third: 0.965); renormalised over the kept mass 1 + e.
  const double e = std::exp(1.0), z = 1 + e + std::exp(-2.0);
  auto a = route_fixed_logits(RouterKind::TopP, true, 0.8).assignment;
  ASSERT_EQ(a.unit_P.numel(), 2);
  EXPECT_EQ(a.unit_P[0].item<int64_t>(), 1);
  EXPECT_EQ(a.unit_P[1].item<int64_t>(), 0);
  EXPECT_NEAR(a.weight_P[0].item<double>(), e / (1 + e), 1e-15);
  EXPECT_NEAR(a.weight_P[1].item<double>(), 1 / (1 + e), 1e-15);
  auto raw = route_fixed_logits(RouterKind::TopP, false, 0.8).assignment;
  EXPECT_NEAR(raw.weight_P[0].item<double>(), e / z, 1e-15);
  EXPECT_NEAR(raw.weight_P[1].item<double>(), 1 / z, 1e-15);
  EXPECT_EQ(route_fixed_logits(RouterKind::TopP, true, 0.7).assignment.unit_P.numel(), 1);  // 0.7054 >= 0.7
}

TEST(Routers, GateScaleMultipliesTheWeightsAndLearns) {
  // softmax top-1 of logits (0, 1, -2): weight p1 = e / z; with gate_scale 3 it is 3 e / z, and
  // d(weight)/d(scale) = e / z, d(weight)/d(logit 1) = 3 p1 (1 - p1)
  const double e = std::exp(1.0), z = 1 + e + std::exp(-2.0), p1 = e / z;
  RouterOptions o;
  o.num_experts = 3;
  o.top_k = 1;
  o.renormalize = false;
  o.gate_scale = 3;
  Router r(1, o);
  r->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    r->weight.copy_(torch::tensor({0.0, 1.0, -2.0}, torch::kFloat64).view({3, 1}));
  }
  auto a = r->forward(torch::ones({1, 1}, torch::kFloat64)).assignment;
  ASSERT_EQ(a.unit_P.numel(), 1);
  EXPECT_EQ(a.unit_P[0].item<int64_t>(), 1);
  EXPECT_NEAR(a.weight_P[0].item<double>(), 3 * p1, 1e-15);
  a.weight_P.sum().backward();
  EXPECT_NEAR(r->gate_scale.grad().item<double>(), p1, 1e-15);
  EXPECT_NEAR(r->weight.grad()[1][0].item<double>(), 3 * p1 * (1 - p1), 1e-14);
  EXPECT_FALSE(Router(1, RouterOptions{}).ptr()->gate_scale.defined());  // off by default: no parameter
}

TEST(Routers, AuxFreeBiasMovesTowardsUnderloadedExperts) {
  RouterOptions o;
  o.num_experts = 4;
  o.top_k = 1;
  o.bias_update = 0.01;
  Router r(4, o);
  r->update_selection_bias(torch::tensor({10, 2, 4, 4}, torch::kLong));  // mean 5
  auto b = r->selection_bias;
  EXPECT_FLOAT_EQ(b[0].item<float>(), -0.01f);
  EXPECT_FLOAT_EQ(b[1].item<float>(), 0.01f);
  EXPECT_FLOAT_EQ(b[2].item<float>(), 0.01f);
  // the bias changes selection only: combine weights stay the unbiased softmax values
  {
    torch::NoGradGuard g;
    r->selection_bias.copy_(torch::tensor({0.f, 0.f, 0.f, 100.f}));
  }
  auto x = torch::randn({5, 4});
  auto out = r->forward(x);
  EXPECT_TRUE(torch::equal(out.assignment.unit_P, torch::full({5}, 3, torch::kLong)));
  auto probs = torch::softmax(torch::matmul(x, r->weight.t()), -1);
  EXPECT_TRUE(torch::allclose(out.assignment.weight_P.detach(), torch::ones({5})));  // renormalized k=1
  o.renormalize = false;
  Router raw(4, o);
  {
    torch::NoGradGuard g;
    raw->weight.copy_(r->weight);
    raw->selection_bias.copy_(r->selection_bias);
  }
  EXPECT_TRUE(torch::allclose(raw->forward(x).assignment.weight_P.detach(), probs.select(1, 3)));
}

TEST(MoEModel, LayerPatternsAndNames) {
  auto c = test::small_moe(31, 16, 4, 4, 2, 8);
  c.moe.n_shared = 1;
  c.moe.layers = "every_other";
  EXPECT_FALSE(is_moe_layer(c, 0));
  EXPECT_TRUE(is_moe_layer(c, 1));
  c.moe.layers = "first_dense:3";
  EXPECT_FALSE(is_moe_layer(c, 2));
  EXPECT_TRUE(is_moe_layer(c, 3));
  c.moe.layers = "0,2";
  EXPECT_TRUE(is_moe_layer(c, 2));
  EXPECT_FALSE(is_moe_layer(c, 1));
  c.moe.layers = "1,x";
  EXPECT_THROW(is_moe_layer(c, 1), ConfigError);
  c.moe.layers = "1,3";
  TransformerLM m(c);
  m->init_weights(1);
  auto p = m->named_parameters();
  EXPECT_TRUE(p.contains("model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(p.contains("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(p.contains("model.layers.3.mlp.shared_experts.down_proj"));
  EXPECT_TRUE(p.contains("model.layers.0.mlp.gate_proj.weight"));  // dense block
  EXPECT_EQ(p["model.layers.1.mlp.experts.gate_up_proj"].sizes(), (std::vector<int64_t>{4, 16, 16}));
  auto counts = m->param_counts();
  EXPECT_EQ(counts.total - counts.active, 2 * (4 - 2) * (4 * 16 * 8 * 3) / 4);  // 2 layers x 2 unused experts
  EXPECT_FALSE(p.contains("model.layers.1.mlp.gate.gate_scale"));
  c.moe.gate_scale = 4;  // the weight initialiser leaves the configured start of the scale alone
  TransformerLM scaled(c);
  scaled->init_weights(1);
  EXPECT_EQ(scaled->named_parameters()["model.layers.1.mlp.gate.gate_scale"].item<double>(), 4.0);
}

namespace {

// A small MoE LM (vocabulary 29, d 16, 2 MoE layers of 4 experts, top-2) trained on one batch
// with AdamW; the loss of every step and the aux terms each step reported
struct SmallMoERun {
  TransformerLM model{nullptr};
  std::vector<double> losses;
  size_t aux_terms = 0;
};
SmallMoERun train_small_moe(int steps) {
  torch::manual_seed(0);
  SmallMoERun run{TransformerLM(test::small_moe(29, 16, 2, 4, 2, 16)), {}};
  run.model->init_weights(2);
  auto tokens = torch::randint(0, 29, {4, 12}, torch::kLong);
  torch::optim::AdamW opt(run.model->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int i = 0; i < steps; ++i) {
    AuxLosses aux;
    auto loss = lm_loss(run.model->forward(tokens, aux), tokens);
    run.aux_terms = aux.terms.size();
    opt.zero_grad();
    (loss + aux.total()).backward();
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

}  // namespace

TEST(MoEModel, TrainsAndReportsAuxLosses) {
  const auto run = train_small_moe(60);
  auto m = run.model;
  EXPECT_EQ(run.aux_terms, 4u);  // aux + z for 2 layers
  const double first = run.losses.front(), last = run.losses.back();
  EXPECT_LT(last, first - 1.0);
  auto layers = moe_layers(m->feed_forwards());
  ASSERT_EQ(layers.size(), 2u);
  auto s = layers[0]->stats_json();
  int64_t total = 0;
  for (auto l : s["load"]) total += l.get<int64_t>();
  EXPECT_EQ(total, 4 * 12 * 2);
  EXPECT_DOUBLE_EQ(s["units_per_token"].get<double>(), 2.0);
}

// Training through the combined path (moe/combined_ffn.h, the default) and the grouped one it
// replaced: float32, 30 AdamW steps of a small MoE LM; the losses agree to float32 rounding (the
// paths sum the same products in different orders).
TEST(MoEModel, CombinedAndGroupedPathsTrainAlike) {
  force_units_path(UnitsPath::Grouped);
  const auto grouped = train_small_moe(30).losses;
  force_units_path(std::nullopt);
  const auto combined = train_small_moe(30).losses;
  EXPECT_LT(combined.back(), combined.front() - 1.0);
  for (size_t i = 0; i < grouped.size(); ++i) EXPECT_NEAR(combined[i], grouped[i], 1e-4 * grouped[i]) << "step " << i;
}
