// UniPool: NormRouter, the pool-level balance loss, shared-pool layout and gradients
// (../shared/specs/unipool.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "analysis/expert_usage.h"
#include "core/config.h"
#include "core/rank_state.h"
#include "methods/unipool/unipool.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "moe/dispatch.h"
#include "moe/routers.h"
#include "test_support.h"
#include "train/parallel.h"

using namespace mf;

namespace {

Router norm_router(int64_t d, int64_t E, int64_t k, bool renormalize = false) {
  RouterOptions o;
  o.kind = RouterKind::NormTopK;
  o.num_experts = E;
  o.top_k = k;
  o.renormalize = renormalize;
  o.aux_loss_coef = 0;
  o.z_loss_coef = 0;
  Router r(d, o);
  r->to(torch::kFloat64);
  return r;
}

ModelConfig pool_model(int64_t groups, int64_t pool_size = 0) {
  auto c = test::small_moe(37, 16, 4, 4, 1, 8);
  c.moe.aux_loss_coef = 0;
  c.moe.z_loss_coef = 0;
  c.moe.section<UniPoolConfig>().groups = groups;
  c.moe.section<UniPoolConfig>().pool_size = pool_size;
  return c;
}

}  // namespace

TEST(NormRouter, ScoresAreInvariantToInputScale) {
  torch::manual_seed(1);
  auto r = norm_router(8, 12, 2);
  auto x = torch::randn({10, 8}, torch::kFloat64);
  auto a = r->forward(x), b = r->forward(x * 37.5);
  EXPECT_TRUE(torch::allclose(a.scores_TE, b.scores_TE, 1e-6, 0));  // up to eps = 1e-8 next to ||z||
  EXPECT_TRUE(torch::equal(a.assignment.unit_P, b.assignment.unit_P));
}

TEST(NormRouter, HandComputedScores) {
  auto r = norm_router(2, 3, 1);
  {
    torch::NoGradGuard g;
    r->weight.copy_(torch::tensor({{1.0, 0.0}, {0.0, 1.0}, {-1.0, -1.0}}, torch::kFloat64));
    r->norm_scale.fill_(2.0);
  }
  // x = (3, 4): z = (3, 4, -7), ||z|| = sqrt(74); s = 2 c relu(z / ||z||)
  auto out = r->forward(torch::tensor({{3.0, 4.0}}, torch::kFloat64));
  const double n = std::sqrt(74.0) + 1e-8, c = r->norm_constant;
  EXPECT_NEAR(out.scores_TE[0][0].item<double>(), 2 * c * 3 / n, 1e-12);
  EXPECT_NEAR(out.scores_TE[0][1].item<double>(), 2 * c * 4 / n, 1e-12);
  EXPECT_EQ(out.scores_TE[0][2].item<double>(), 0.0);
  EXPECT_EQ(out.assignment.unit_P[0].item<int64_t>(), 1);
  EXPECT_NEAR(out.assignment.weight_P[0].item<double>(), 2 * c * 4 / n, 1e-12);  // the score itself, no renorm
}

TEST(NormRouter, ConstantMatchesReferenceAndIsDeterministic) {
  // authors' numpy values (seed 42, 1e5 samples); our generator differs, so within MC error
  EXPECT_NEAR(norm_router_constant(96, 1), 4.016194, 0.03);
  EXPECT_NEAR(norm_router_constant(192, 1), 5.158132, 0.03);
  EXPECT_NEAR(norm_router_constant(16, 2), 1.918122, 0.02);
  EXPECT_NEAR(norm_router_constant(64, 8), 1.713798, 0.02);
  EXPECT_EQ(norm_router_constant(96, 1), norm_router_constant(96, 1));
  EXPECT_EQ(norm_router_constant(24, 1, 5000), norm_router_constant(24, 1, 5000));
  // M = 8, k = 1: one sample in 256 has no positive entry (inf in the reference code)
  EXPECT_TRUE(std::isfinite(norm_router_constant(8, 1)));
  EXPECT_EQ(norm_router(4, 96, 1)->norm_constant, norm_router_constant(96, 1));
}

TEST(NormRouter, AllNegativeLogitsGiveZeroWeightsNotNaN) {
  for (bool renorm : {false, true}) {
    auto r = norm_router(3, 5, 2, renorm);
    {
      torch::NoGradGuard g;
      r->weight.fill_(-1.0);
    }
    auto x = torch::rand({6, 3}, torch::kFloat64).add_(0.1).requires_grad_(true);  // z < 0 everywhere
    auto out = r->forward(x);
    EXPECT_EQ(out.assignment.weight_P.abs().sum().item<double>(), 0.0);
    ExpertBank bank(5, 3, 4);
    bank.to(torch::kFloat64);
    auto y = dispatch(x, out.assignment, bank).y_TD;
    EXPECT_EQ(y.abs().sum().item<double>(), 0.0);
    (y.sum() + out.scores_TE.sum()).backward();
    EXPECT_FALSE(x.grad().isnan().any().item<bool>());
    EXPECT_FALSE(r->weight.grad().isnan().any().item<bool>());
  }
  auto zero = norm_router(3, 5, 1)->forward(torch::zeros({2, 3}, torch::kFloat64));  // ||z|| = 0
  EXPECT_FALSE(zero.scores_TE.isnan().any().item<bool>());
}

TEST(NormRouter, MatchesDenseReferenceWithoutRenormalization) {
  torch::manual_seed(4);
  auto r = norm_router(6, 10, 3);
  ExpertBank bank(10, 6, 5);
  bank.to(torch::kFloat64);
  auto x = torch::randn({9, 6}, torch::kFloat64);
  auto grads = [&](bool fast) {
    auto xi = x.clone().requires_grad_(true);
    for (auto& p : r->parameters()) p.mutable_grad() = at::Tensor();
    for (auto& p : bank.parameters()) p.mutable_grad() = at::Tensor();
    auto out = r->forward(xi);
    auto y = fast ? dispatch(xi, out.assignment, bank).y_TD : dense_reference(xi, out.assignment, bank);
    (y * y.detach().sin()).sum().backward();
    return std::vector<at::Tensor>{y.detach(),
                                   xi.grad(),
                                   r->weight.grad().clone(),
                                   r->norm_scale.grad().clone(),
                                   bank.gate_up_proj.grad().clone(),
                                   bank.down_proj.grad().clone()};
  };
  auto fast = grads(true), ref = grads(false);
  for (size_t i = 0; i < fast.size(); ++i) EXPECT_TRUE(torch::allclose(fast[i], ref[i], 1e-10, 1e-12)) << i;
}

TEST(PoolBalance, DecomposedLossEqualsDirectFormula) {
  torch::manual_seed(2);
  const int64_t M = 6, L = 3, T = 8;
  PoolBalance pb(M, L, 0.01);
  pb->to(torch::kFloat64);
  std::vector<at::Tensor> units0, scores1;
  auto fbar = torch::zeros({M}, torch::kFloat64);
  for (int64_t l = 0; l < L; ++l) {  // micro-batch 0: no loss yet
    units0.push_back(torch::randint(0, M, {T}, torch::kLong));
    fbar += at::bincount(units0.back(), {}, M).to(torch::kFloat64) / double(T) / double(L);
    EXPECT_EQ(pb->layer_loss(torch::rand({T, M}, torch::kFloat64), units0.back(), true).item<double>(), 0.0);
  }
  EXPECT_EQ(pb->ready.item<double>(), 1.0);
  EXPECT_TRUE(torch::allclose(pb->fraction, fbar));
  auto sum = torch::zeros({}, torch::kFloat64), pbar = torch::zeros({M}, torch::kFloat64);
  for (int64_t l = 0; l < L; ++l) {  // micro-batch 1 uses micro-batch 0's fractions
    scores1.push_back(torch::rand({T, M}, torch::kFloat64));
    pbar += scores1.back().mean(0) / double(L);
    sum += pb->layer_loss(scores1.back(), torch::randint(0, M, {T}, torch::kLong), true);
  }
  EXPECT_NEAR((sum / double(L)).item<double>(), pool_aux_loss(fbar, pbar, 0.01).item<double>(), 1e-14);
  // hand check: alpha * M * sum_i fbar_i pbar_i
  EXPECT_NEAR(pool_aux_loss(fbar, pbar, 0.01).item<double>(), 0.01 * M * (fbar * pbar).sum().item<double>(), 1e-15);
  // uniform usage and uniform scores 1/M give alpha, as the Switch loss does
  EXPECT_NEAR(
      pool_aux_loss(torch::full({M}, 1.0 / M, torch::kFloat64), torch::full({M}, 1.0 / M, torch::kFloat64), 0.01)
          .item<double>(),
      0.01, 1e-15);
}

TEST(PoolBalance, UsesPreviousMicroBatchAndIgnoresEvaluation) {
  const int64_t M = 4, L = 2;
  PoolBalance pb(M, L, 1.0);
  pb->to(torch::kFloat64);
  auto all_to = [&](int64_t e) { return torch::full({4}, e, torch::kLong); };
  auto s = torch::full({4, M}, 0.25, torch::kFloat64);
  EXPECT_EQ(pb->layer_loss(s, all_to(0), true).item<double>(), 0.0);
  EXPECT_EQ(pb->layer_loss(s, all_to(0), true).item<double>(), 0.0);  // t = 0: everything went to expert 0
  EXPECT_EQ(pb->ready.item<double>(), 1.0);
  pb->layer_loss(s, all_to(3), false);  // evaluation: a loss, but not recorded
  auto scores = torch::tensor({{1.0, 0.0, 0.0, 0.0}, {0.5, 0.5, 0.0, 0.0}}, torch::kFloat64);
  // t = 1: fbar = e_0 from t = 0 (not the units routed now): M * fbar . mean(scores) = 4 * 0.75
  EXPECT_DOUBLE_EQ(pb->layer_loss(scores, all_to(2).slice(0, 0, 2), true).item<double>(), 3.0);
  EXPECT_DOUBLE_EQ(pb->layer_loss(scores, all_to(2).slice(0, 0, 2), true).item<double>(), 3.0);
  // t = 2 sees t = 1's routing (all to expert 2): mean score of expert 2 is 0
  EXPECT_DOUBLE_EQ(pb->layer_loss(scores, all_to(1).slice(0, 0, 2), true).item<double>(), 0.0);
}

TEST(SharedPool, ModelGradientIsSumOfPerLayerCopies) {
  // The real model: one pool of 16 experts shared by 4 layers vs a vanilla model of 16 private
  // experts per layer, each a copy of the pool. Same routing, so the pool's gradient must be
  // the sum of the copies' gradients.
  torch::manual_seed(5);
  auto pooled_cfg = pool_model(1), copies_cfg = pool_model(0);
  copies_cfg.moe.num_experts = 16;
  TransformerLM pooled(pooled_cfg), copies(copies_cfg);
  pooled->init_weights(4);
  pooled->to(torch::kFloat64);
  copies->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    auto src = pooled->named_parameters();
    for (auto& p : copies->named_parameters()) {
      auto name = p.key();
      auto pos = name.find(".mlp.experts.");
      if (pos != std::string::npos) name = "model.layers.0" + name.substr(name.find(".mlp.experts."));
      p.value().copy_(src[name]);
    }
  }
  auto tokens = torch::randint(0, 37, {2, 9}, torch::kLong);
  for (auto* m : {&pooled, &copies}) {
    auto logits = (*m)->forward(tokens);
    lm_loss(logits, tokens).backward();
  }
  auto pg = pooled->named_parameters(), cg = copies->named_parameters();
  for (std::string w : {"gate_up_proj", "down_proj"}) {
    auto sum = torch::zeros_like(pg["model.layers.0.mlp.experts." + w]);
    for (int l = 0; l < 4; ++l) sum += cg["model.layers." + std::to_string(l) + ".mlp.experts." + w].grad();
    EXPECT_GT(cg["model.layers.3.mlp.experts." + w].grad().abs().sum().item<double>(), 0);
    EXPECT_TRUE(torch::allclose(pg["model.layers.0.mlp.experts." + w].grad(), sum, 1e-10, 1e-12)) << w;
  }
}

TEST(SharedPool, InModelPoolLossUsesNormScoresAndPreviousFractions) {
  // L_l = alpha * M * sum_i fbar_i * mean_t s_ti, with s the layer's NormRouter scores now and
  // fbar the pairs' shares averaged over the pool's layers in the previous training micro-batch.
  torch::manual_seed(8);
  auto c = pool_model(1);
  c.moe.router = RouterKind::NormTopK;
  c.moe.top_k = 2;
  const double alpha = 0.05;
  c.moe.section<UniPoolConfig>().aux_loss_coef = alpha;
  TransformerLM m(c);
  m->init_weights(6);
  m->to(torch::kFloat64);
  m->train();
  auto layers = moe_layers(m->feed_forwards());
  const int64_t M = 16, L = 4;
  std::vector<at::Tensor> units(L), scores(L);
  for (int64_t l = 0; l < L; ++l)
    layers[l]->dispatch_hook = [&, l](const at::Tensor& x_TD, const RouterOutput& routed) {
      const auto& a = routed.assignment;
      auto& gate = layers[l]->gate;
      units[l] = a.unit_P.clone();
      scores[l] = norm_router_scores(torch::matmul(x_TD, gate->weight.t()), gate->norm_scale, gate->norm_constant,
                                     c.moe.norm_eps)
                      .detach();
    };
  auto step = [&](const at::Tensor& tokens) {
    AuxLosses aux;
    auto logits = m->forward(tokens, aux);  // before aux.total(): the forward fills `aux`
    auto loss = lm_loss(logits, tokens) + aux.total();
    loss.backward();
    return aux;
  };
  step(torch::randint(0, 37, {2, 9}, torch::kLong));
  auto fbar = torch::zeros({M}, torch::kFloat64);
  for (auto& u : units) fbar += at::bincount(u, {}, M).to(torch::kFloat64) / double(u.numel()) / double(L);
  auto aux = step(torch::randint(0, 37, {2, 9}, torch::kLong));
  int found = 0;
  for (auto& [name, v] : aux.terms)
    for (int64_t l = 0; l < L; ++l)
      if (name == "moe" + std::to_string(l) + ".pool_aux") {
        const double expect = alpha * M * (fbar * scores[l].mean(0)).sum().item<double>() / double(L);
        EXPECT_NEAR(v.item<double>(), expect, 1e-12) << name;
        EXPECT_GT(expect, 0);
        ++found;
      }
  EXPECT_EQ(found, L);
}

TEST(Probe, RandomRoutingDrawsDistinctCandidatesAndMatchedSetIsMostUsed) {
  auto c = pool_model(1);
  c.moe.top_k = 2;
  TransformerLM m(c);
  m->init_weights(2);
  auto layer = moe_layers(m->feed_forwards())[1];
  const std::vector<int64_t> candidates = {11, 2, 7};
  layer->random_routing = MoEFeedForward::RandomRouting{candidates, 3};
  at::Tensor unit_P;
  layer->dispatch_hook = [&](const at::Tensor&, const RouterOutput& routed) {
    const auto& a = routed.assignment;
    unit_P = a.unit_P.clone();
  };
  m->forward(torch::randint(0, 37, {3, 20}, torch::kLong));
  auto u_TK = unit_P.view({-1, 2});
  std::set<int64_t> seen;
  for (int64_t t = 0; t < u_TK.size(0); ++t) {
    const auto a = u_TK[t][0].item<int64_t>(), b = u_TK[t][1].item<int64_t>();
    EXPECT_NE(a, b) << "token " << t << ": drawn with replacement";
    seen.insert(a);
    seen.insert(b);
  }
  EXPECT_EQ(seen, std::set<int64_t>(candidates.begin(), candidates.end()));  // 60 tokens hit all three
  // the matched set: the n most-used experts of the row, ties broken by index
  ExpertUsage usage;
  usage.layers = {0};
  usage.group = {0};
  usage.counts = {{3, 9, 9, 0, 5, 5}};
  EXPECT_EQ(usage.most_used(0, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(usage.most_used(0, 4), (std::vector<int64_t>{1, 2, 4, 5}));
}

TEST(SharedPool, OneGroupPerLayerIsVanillaMoE) {
  auto vanilla = pool_model(0), pooled = pool_model(4);
  TransformerLM a(vanilla), b(pooled);
  a->init_weights(9), b->init_weights(9);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (auto& p : pa) {
    ASSERT_TRUE(pb.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }
  auto tokens = torch::randint(0, 37, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens)));
  EXPECT_EQ(a->param_counts().active, b->param_counts().active);
  EXPECT_EQ(a->param_counts().expert_stored, b->param_counts().expert_stored);
}

TEST(SharedPool, OnePoolStoredOncePerGroup) {
  auto c = pool_model(2, 12);  // 4 MoE layers, 2 groups of 2 layers, 6 experts each
  c.moe.router = RouterKind::NormTopK;
  c.moe.section<UniPoolConfig>().aux_loss_coef = 0.01;
  TransformerLM m(c);
  m->init_weights(3);
  auto names = m->named_parameters();
  EXPECT_TRUE(names.contains("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(names.contains("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(names.contains("model.layers.2.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(names.contains("model.layers.3.mlp.gate.norm_scale"));
  EXPECT_EQ(names["model.layers.3.mlp.gate.norm_scale"].item<double>(), 1.0);
  EXPECT_EQ(names["model.layers.3.mlp.gate.weight"].sizes(), (std::vector<int64_t>{6, 16}));
  EXPECT_TRUE(m->named_buffers().contains("model.layers.2.mlp.pool_balance.fraction"));
  auto layers = moe_layers(m->feed_forwards());
  EXPECT_EQ(layers[0]->experts.get(), layers[1]->experts.get());
  EXPECT_NE(layers[1]->experts.get(), layers[2]->experts.get());
  auto counts = m->param_counts();
  const int64_t per_expert = 3 * 16 * 8;
  EXPECT_EQ(counts.expert_stored, 12 * per_expert);
  EXPECT_EQ(counts.expert_vanilla, 16 * per_expert);
  EXPECT_EQ(counts.router, 4 * (6 * 16 + 1));
  EXPECT_EQ(counts.total - counts.active, 12 * per_expert - 4 * per_expert);  // 4 layers use 1 expert each
  // the pool loss appears from the second training micro-batch on
  m->train();
  auto tokens = torch::randint(0, 37, {2, 9}, torch::kLong);
  auto pool_terms = [&] {
    AuxLosses aux;
    auto loss = lm_loss(m->forward(tokens, aux), tokens);
    if (auto a = aux.total(); a.defined()) loss = loss + a;
    loss.backward();  // the pool refreshes fbar during the forward: backward must still work
    int n = 0;
    double sum = 0;
    for (auto& t : aux.terms)
      if (t.first.find("pool_aux") != std::string::npos) {
        ++n;
        sum += t.second.item<double>();
      }
    return std::make_pair(n, sum);
  };
  EXPECT_EQ(pool_terms(), std::make_pair(4, 0.0));  // no fractions yet: the loss is 0
  auto second = pool_terms();
  EXPECT_EQ(second.first, 4);
  EXPECT_GT(second.second, 0.0);
}

TEST(SharedPool, ConfigValidationNamesTheKey) {
  EXPECT_NE(test::config_error({"model.ffn=moe", "model.n_layers=4", "model.moe.unipool.groups=3"})
                .find("model.moe.unipool.groups"),
            std::string::npos);
  EXPECT_NE(test::config_error({"model.moe.unipool.aux_loss_coef=0.01"}).find("model.moe.unipool.groups"),
            std::string::npos);
  // combinations that cannot work name both keys
  auto e = test::config_error({"model.ffn=moe", "model.moe.unipool.groups=1", "model.moe.capacity_factor=1.5"});
  EXPECT_NE(e.find("model.moe.unipool.groups"), std::string::npos) << e;
  EXPECT_NE(e.find("model.moe.capacity_factor"), std::string::npos) << e;
  // the old flat keys still load (configs and checkpoints written before the sub-table)
  Config c;
  apply_override(c, "model.moe.pool_groups=2");
  apply_override(c, "model.moe.pool_aux_loss_coef=0.02");
  EXPECT_EQ(c.model.moe.section<UniPoolConfig>().groups, 2);
  EXPECT_EQ(c.model.moe.section<UniPoolConfig>().aux_loss_coef, 0.02);
  EXPECT_NE(to_toml(c).find("moe.unipool.groups = 2"), std::string::npos);
}

namespace {

// A second rank simulated in one process: sum() adds the partner's tensors.
class PartnerGroup : public DataParallel {
 public:
  explicit PartnerGroup(std::vector<at::Tensor> partner) : partner_(std::move(partner)) {}
  int rank() const override { return 0; }
  int world() const override { return 2; }
  void sum(std::vector<at::Tensor>& t) override {
    ASSERT_EQ(t.size(), partner_.size());
    for (size_t i = 0; i < t.size(); ++i) t[i].add_(partner_[i]);
  }
  void start_sum(std::vector<at::Tensor>) override {}
  void finish_sums() override {}
  void broadcast(std::vector<at::Tensor>&) override {}
  void barrier() override {}
  void all_to_all(at::Tensor&, at::Tensor&, std::vector<int64_t>, std::vector<int64_t>) override {}
  double take_comm_seconds() override { return 0; }

 private:
  std::vector<at::Tensor> partner_;
};

}  // namespace

TEST(SharedPool, DataParallelRanksAverageThePoolFractions) {
  auto c = pool_model(2);
  c.moe.section<UniPoolConfig>().aux_loss_coef = 0.01;
  TransformerLM m(c);
  auto state = collect_rank_state(*m);
  ASSERT_EQ(state.size(), 4u);  // two pools: fraction and ready each, pool by pool
  EXPECT_EQ(state[0].numel(), 8);
  m->train();
  AuxLosses aux;
  m->forward(torch::randint(0, 37, {2, 9}, torch::kLong), aux);  // measures this rank's fractions
  const auto mine = state[0].clone();
  EXPECT_NEAR(mine.sum().item<double>(), 1.0, 1e-6);
  auto partner = torch::zeros({8});
  partner[3] = 1;  // the other rank sent every pair to expert 3
  PartnerGroup group({partner, torch::ones({}), torch::zeros({8}), torch::ones({})});
  average_over_ranks(group, state);
  EXPECT_TRUE(torch::allclose(collect_rank_state(*m)[0], (mine + partner) / 2));  // in place, in the module
  EXPECT_DOUBLE_EQ(state[1].item<double>(), 1.0);                                 // measured on both ranks
  TransformerLM plain(pool_model(2));                                             // no pool loss: nothing to agree on
  EXPECT_TRUE(collect_rank_state(*plain).empty());
}
