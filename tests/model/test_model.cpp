// Model layers against their formulas and dense references, in float64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "core/unit_gemm.h"
#include "methods/latent/latent.h"
#include "methods/unif/unif.h"
#include "methods/unipool/unipool.h"
#include "model/cross_entropy_rows.h"
#include "model/fused_loss.h"
#include "model/moe_ffn.h"
#include "model/small_attention.h"
#include "model/transformer.h"
#include "model/vit.h"
#include "serve/generate.h"
#include "test_support.h"
#include "train/optim.h"

using namespace mf;

namespace {

ModelConfig tiny(int64_t kv_heads = 2) {
  ModelConfig c;
  c.vocab_size = 37;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = kv_heads;
  c.ffn_hidden = 24;
  c.max_seq_len = 32;
  c.init_std = 0.2;
  return c;
}

TransformerLM make_model(const ModelConfig& c, uint64_t seed = 1) {
  TransformerLM m(c);
  m->init_weights(seed);
  m->to(torch::kFloat64);
  return m;
}

}  // namespace

TEST(RMSNorm, MatchesHandComputedValue) {
  RMSNorm n(2, 0.0);
  {
    torch::NoGradGuard g;
    n->weight.copy_(torch::tensor({1.0, 2.0}));
  }
  n->to(torch::kFloat64);
  auto y = n->forward(torch::tensor({{3.0, 4.0}}, torch::kFloat64));
  const double r = std::sqrt((9.0 + 16.0) / 2.0);  // rms of (3, 4)
  EXPECT_NEAR(y[0][0].item<double>(), 3.0 / r, 1e-12);
  EXPECT_NEAR(y[0][1].item<double>(), 2.0 * 4.0 / r, 1e-12);
}

TEST(RMSNorm, MatchesFormulaWithEps) {
  RMSNorm n(8, 1e-3);
  n->to(torch::kFloat64);
  auto x = torch::randn({5, 8}, torch::kFloat64);
  auto ref = x / torch::sqrt((x * x).mean(-1, true) + 1e-3);
  EXPECT_TRUE(torch::allclose(n->forward(x), ref, 1e-12, 1e-12));
}

TEST(Rope, PositionZeroIsIdentityAndNormPreserved) {
  RopeTable r(16, 8, 10000.0);
  auto x = torch::randn({1, 2, 5, 8}, torch::kFloat64);
  auto y = r.apply(x, 0);
  EXPECT_TRUE(torch::allclose(y.select(2, 0), x.select(2, 0), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(y.norm(2, -1), x.norm(2, -1), 1e-10, 1e-10));
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  RopeTable r(64, 8, 10000.0);
  auto q = torch::randn({1, 1, 1, 8}, torch::kFloat64), k = torch::randn({1, 1, 1, 8}, torch::kFloat64);
  auto dot = [&](int64_t pq, int64_t pk) { return (r.apply(q, pq) * r.apply(k, pk)).sum().item<double>(); };
  EXPECT_NEAR(dot(5, 2), dot(13, 10), 1e-10);
  EXPECT_NEAR(dot(0, 7), dot(20, 27), 1e-10);
  EXPECT_GT(std::abs(dot(5, 2) - dot(5, 3)), 1e-6);  // and it does depend on the offset
}

TEST(Rope, HandComputedRotation) {
  // head_dim 2: one pair rotated by angle = position * theta^0 = position
  RopeTable r(4, 2, 10000.0);
  auto x = torch::tensor({1.0, 0.0}, torch::kFloat64).view({1, 1, 1, 2});
  auto y = r.apply(x, 1);
  EXPECT_NEAR(y.view(-1)[0].item<double>(), std::cos(1.0), 1e-12);
  EXPECT_NEAR(y.view(-1)[1].item<double>(), std::sin(1.0), 1e-12);
}

TEST(Attention, IsCausal) {
  auto m = make_model(tiny());
  auto tokens = torch::randint(0, 37, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  changed.narrow(1, 7, 5).random_(0, 37);
  torch::NoGradGuard g;
  auto a = m->forward(tokens), b = m->forward(changed);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 7), b.narrow(1, 0, 7)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 7, 5), b.narrow(1, 7, 5)));
}

TEST(Attention, GroupedQueryEqualsMultiHeadWithSharedKV) {
  auto gqa = make_model(tiny(2));
  auto mha = make_model(tiny(4), 2);
  {
    torch::NoGradGuard g;
    auto src = gqa->named_parameters();
    for (auto& p : mha->named_parameters()) {
      auto t = src[p.key()];
      bool kv = p.key().find("k_proj") != std::string::npos || p.key().find("v_proj") != std::string::npos;
      if (kv) t = t.view({2, 4, 16}).repeat_interleave(2, 0).reshape({16, 16});  // head h reads kv h/2
      p.value().copy_(t);
    }
  }
  auto tokens = torch::randint(0, 37, {2, 9}, torch::kLong);
  torch::NoGradGuard g;
  EXPECT_TRUE(torch::allclose(gqa->forward(tokens), mha->forward(tokens), 1e-10, 1e-10));
}

TEST(Attention, KVCacheMatchesFullForward) {
  auto m = make_model(tiny());
  auto tokens = torch::randint(0, 37, {1, 10}, torch::kLong);
  torch::NoGradGuard g;
  auto full = m->forward(tokens);
  std::vector<LayerCache> caches;
  AuxLosses aux;
  auto first = m->forward(tokens.narrow(1, 0, 4), aux, &caches);
  EXPECT_TRUE(torch::allclose(first, full.narrow(1, 0, 4), 1e-10, 1e-10));
  for (int64_t t = 4; t < 10; ++t) {
    auto step = m->forward(tokens.narrow(1, t, 1), aux, &caches);
    EXPECT_TRUE(torch::allclose(step.squeeze(1), full.select(1, t), 1e-10, 1e-10)) << "position " << t;
  }
}

TEST(Attention, SmallKernelMatchesMatmulSoftmaxInOutputAndGradients) {
  torch::manual_seed(8);
  struct Case {
    int64_t B, H, N, S, Dh;
    bool causal;
    int64_t Hkv = 0;  // grouped-query: k and v of fewer heads, read in place (0: H)
  };
  for (auto c : {Case{2, 3, 5, 5, 4, false}, Case{2, 3, 5, 5, 4, true}, Case{1, 2, 3, 7, 5, true} /* a cache of 4 */,
                 Case{3, 1, 1, 6, 3, true}, Case{2, 2, 17, 17, 24, false}, Case{1, 2, 90, 130, 8, true},
                 Case{1, 1, 19, 37, 40, true} /* tiles of 4 rows x 16 columns and their tails */,
                 Case{2, 6, 13, 13, 8, false, 2}, Case{2, 6, 5, 20, 8, true, 2} /* dK, dV summed per kv head */}) {
    const int64_t Hkv = c.Hkv ? c.Hkv : c.H;
    auto q = torch::randn({c.B, c.H, c.N, c.Dh}, torch::kFloat64).requires_grad_(true);
    auto k = torch::randn({c.B, Hkv, c.S, c.Dh}, torch::kFloat64).requires_grad_(true);
    auto v = torch::randn({c.B, Hkv, c.S, c.Dh}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({c.B, c.H, c.N, c.Dh}, torch::kFloat64);
    // the reference repeats each kv head for its query heads
    auto kr = k.repeat_interleave(c.H / Hkv, 1), vr = v.repeat_interleave(c.H / Hkv, 1);
    auto scores = torch::matmul(q, kr.transpose(-2, -1)) / std::sqrt(static_cast<double>(c.Dh));
    if (c.causal)  // query i sits at position i + S - N
      scores = scores.masked_fill(torch::ones({c.N, c.S}, torch::kBool).triu(c.S - c.N + 1),
                                  -std::numeric_limits<double>::infinity());
    auto ref = torch::matmul(torch::softmax(scores, -1), vr);
    auto fast = small_attention(q, k, v, c.causal);
    const std::string what = "N=" + std::to_string(c.N) + " S=" + std::to_string(c.S) + (c.causal ? " causal" : "") +
                             " kv heads " + std::to_string(Hkv);
    EXPECT_TRUE(torch::allclose(fast, ref, 1e-12, 1e-12)) << what;
    auto g_fast = torch::autograd::grad({(fast * up).sum()}, {q, k, v});
    auto g_ref = torch::autograd::grad({(ref * up).sum()}, {q, k, v});
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(torch::allclose(g_fast[i], g_ref[i], 1e-11, 1e-12)) << what << " grad "
                                                                      << "qkv"[i];
  }
}

TEST(Attention, KernelTakesUpTo64KeysOr512WithHeadsUpTo64) {
  const auto q = [](int64_t Dh) { return torch::zeros({1, 1, 1, Dh}); };
  EXPECT_TRUE(small_attention_applies(q(128), 64));
  EXPECT_FALSE(small_attention_applies(q(128), 65));
  EXPECT_TRUE(small_attention_applies(q(64), 512));
  EXPECT_FALSE(small_attention_applies(q(64), 513));
  EXPECT_FALSE(small_attention_applies(q(32).to(torch::kMeta), 16));
}

TEST(Attention, PackedKernelReadsTheProjectionLayoutInPlace) {
  torch::manual_seed(9);
  for (bool causal : {false, true}) {
    const int64_t B = 2, T = 5, H = 3, Dh = 4;
    auto qkv = torch::randn({B, T, 3, H, Dh}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({B, T, H, Dh}, torch::kFloat64);
    auto heads = qkv.permute({2, 0, 3, 1, 4});  // [3, B, H, T, Dh]
    auto scores = torch::matmul(heads[0], heads[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
    if (causal)
      scores = scores.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
    auto ref = torch::matmul(torch::softmax(scores, -1), heads[2]).transpose(1, 2);  // [B, T, H, Dh]
    auto fast = small_attention_packed(qkv, causal);
    ASSERT_EQ(fast.sizes(), ref.sizes());
    EXPECT_TRUE(torch::allclose(fast, ref, 1e-12, 1e-12)) << (causal ? "causal" : "full");
    auto g_fast = torch::autograd::grad({(fast * up).sum()}, {qkv})[0];
    auto g_ref = torch::autograd::grad({(ref * up).sum()}, {qkv})[0];
    EXPECT_TRUE(torch::allclose(g_fast, g_ref, 1e-11, 1e-12)) << (causal ? "causal" : "full");
  }
}

TEST(SwiGLU, MatchesFormula) {
  SwiGLU f(6, 10);
  f.to(torch::kFloat64);
  auto x = torch::randn({3, 6}, torch::kFloat64);
  AuxLosses aux;
  auto w1 = f.gate_proj->weight, w3 = f.up_proj->weight, w2 = f.down_proj->weight;
  auto a = torch::matmul(x, w1.t());
  auto ref = torch::matmul((a / (1 + torch::exp(-a))) * torch::matmul(x, w3.t()), w2.t());
  EXPECT_TRUE(torch::allclose(f.forward(x, aux), ref, 1e-12, 1e-12));
  EXPECT_TRUE(aux.terms.empty());
}

TEST(Transformer, HuggingFaceParameterNames) {
  auto m = make_model(tiny());
  auto p = m->named_parameters();
  for (const char* n :
       {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(p.contains(n)) << n;
  EXPECT_EQ(p["model.layers.0.self_attn.k_proj.weight"].sizes(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(static_cast<int64_t>(p.size()), 2 + 9 * 2 + 1);
}

TEST(Transformer, InitFollowsConfig) {
  ModelConfig c = tiny();
  c.d_model = 64;
  c.ffn_hidden = 128;
  c.vocab_size = 500;
  c.init_std = 0.05;
  c.n_layers = 8;
  TransformerLM m(c);
  m->init_weights(3);
  auto p = m->named_parameters();
  EXPECT_TRUE(torch::equal(p["model.norm.weight"], torch::ones({64})));
  EXPECT_NEAR(p["model.embed_tokens.weight"].std().item<double>(), 0.05, 0.002);
  EXPECT_NEAR(p["model.layers.0.mlp.down_proj.weight"].std().item<double>(), 0.05 / 4.0, 0.001);
  EXPECT_NEAR(p["model.layers.0.self_attn.o_proj.weight"].std().item<double>(), 0.05 / 4.0, 0.001);
  TransformerLM again(c);
  again->init_weights(3);
  EXPECT_TRUE(torch::equal(again->lm_head->weight, m->lm_head->weight));
}

TEST(Transformer, GradientMatchesFiniteDifferences) {
  auto m = make_model(tiny());
  auto tokens = torch::randint(0, 37, {2, 6}, torch::kLong), targets = torch::randint(0, 37, {2, 6}, torch::kLong);
  auto loss_fn = [&] { return lm_loss(m->forward(tokens), targets); };
  m->zero_grad();
  loss_fn().backward();
  torch::NoGradGuard g;
  int checked = 0;
  for (auto& p : m->named_parameters()) {
    auto flat = p.value().view(-1);
    auto grad = p.value().grad().view(-1);
    for (int64_t i : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
      const double h = 1e-6, orig = flat[i].item<double>();
      flat[i] = orig + h;
      double up = loss_fn().item<double>();
      flat[i] = orig - h;
      double down = loss_fn().item<double>();
      flat[i] = orig;
      double numeric = (up - down) / (2 * h), analytic = grad[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-7 + 1e-5 * std::abs(numeric)) << p.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 21 * 3);
}

TEST(Transformer, OverfitsOneBatch) {
  torch::manual_seed(0);
  ModelConfig c = tiny();
  c.init_std = 0.02;
  TransformerLM m(c);
  m->init_weights(5);
  TrainConfig tc;
  tc.lr = 1e-2;
  tc.weight_decay = 0.0;
  auto opt = make_optimizer(*m, tc);
  auto tokens = torch::randint(0, 37, {4, 16}, torch::kLong), targets = torch::randint(0, 37, {4, 16}, torch::kLong);
  double first = 0, last = 0;
  for (int i = 0; i < 150; ++i) {
    opt->zero_grad();
    auto loss = lm_loss(m->forward(tokens), targets);
    loss.backward();
    opt->step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(37.0), 0.1);
  EXPECT_LT(last, 0.05);
}

TEST(Generate, TopPKeepsSmallestPrefix) {
  auto p = torch::tensor({0.1, 0.5, 0.3, 0.1}, torch::kFloat64);
  auto f = top_p_filter(p, 0.7);  // 0.5 + 0.3 reaches 0.7
  EXPECT_TRUE(torch::allclose(f, torch::tensor({0.0, 0.625, 0.375, 0.0}, torch::kFloat64)));
  EXPECT_TRUE(torch::allclose(top_p_filter(p, 0.4), torch::tensor({0.0, 1.0, 0.0, 0.0}, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(top_p_filter(p, 1.0), p));
}

TEST(Generate, FirstMaxFollowsArgmaxOnTiesAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> cases = {{1, 3, 2, 3},      {-inf, -inf},     {5}, {0, nan, 7, nan}, {nan, 1},
                                                 {2, inf, inf, -1}, {-0.0f, 0.0f, -1}};
  for (const auto& c : cases) {
    const auto t = torch::tensor(c, torch::kFloat);
    EXPECT_EQ(first_max(c.data(), static_cast<int64_t>(c.size())), t.argmax().item<int64_t>()) << t;
  }
  auto logits = torch::randn({1000}, torch::kFloat);
  logits[417] = logits.max() + 1, logits[900] = logits[417];
  EXPECT_EQ(first_max(logits.data_ptr<float>(), 1000), 417);
}

TEST(Generate, SeededAndGreedyAreDeterministic) {
  auto m = make_model(tiny());
  SamplingOptions o;
  o.max_tokens = 8;
  auto a = generate(m, {1, 2, 3}, o), b = generate(m, {1, 2, 3}, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 8u);
  o.temperature = 0;
  auto greedy = generate(m, {1, 2, 3}, o);
  torch::NoGradGuard g;
  auto logits = m->forward(torch::tensor({1, 2, 3}, torch::kLong).unsqueeze(0));
  EXPECT_EQ(greedy[0], logits[0][2].argmax().item<int64_t>());
}

TEST(Generate, RowsThatEndLeaveTheBatchAndTheOthersAreUnchanged) {
  auto m = make_model(tiny());
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {7, 7, 7}, {30, 0, 12}, {4, 5, 6}};
  const std::vector<int64_t> max_tokens = {2, 8, 0, 8};
  std::vector<std::vector<int>> got(prompts.size());
  std::vector<DecodeRow> rows;
  for (size_t r = 0; r < prompts.size(); ++r) {
    SamplingOptions o;
    o.temperature = r == 3 ? 0.9 : 0.0;
    o.seed = 40 + r;
    o.max_tokens = max_tokens[r];
    rows.push_back({prompts[r], o, [&got, r](int id) {
                      got[r].push_back(id);
                      return r != 1 || got[r].size() < 3;  // row 1 hangs up after 3 tokens
                    }});
  }
  decode_rows(m, rows);
  for (size_t r = 0; r < prompts.size(); ++r) {
    auto single = rows[r].opt;
    if (r == 1) single.max_tokens = 3;
    EXPECT_EQ(got[r], generate(m, prompts[r], single)) << "row " << r;
  }
  EXPECT_EQ(got[0].size(), 2u);
  EXPECT_EQ(got[1].size(), 3u);
  EXPECT_TRUE(got[2].empty());
  EXPECT_EQ(got[3].size(), 8u);
}

TEST(Generate, BatchRowsEqualSingleGenerations) {
  auto m = make_model(tiny());
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {7, 7, 7}, {30, 0, 12}};
  for (double temperature : {0.0, 0.9}) {
    SamplingOptions o;
    o.max_tokens = 6;
    o.temperature = temperature;
    const auto batch = generate_batch(m, prompts, o);
    ASSERT_EQ(batch.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      auto single = o;
      single.seed = o.seed + r;  // row r samples with its own generator
      EXPECT_EQ(batch[r], generate(m, prompts[r], single)) << "row " << r << " temperature " << temperature;
    }
  }
  SamplingOptions o;  // a row stops at its stop token, the others go on
  o.temperature = 0;
  o.max_tokens = 5;
  const auto free_run = generate_batch(m, prompts, o);
  o.stop_token = free_run[1][1];
  const auto stopped = generate_batch(m, prompts, o);
  EXPECT_EQ(stopped[1].size(), free_run[1][0] == o.stop_token ? 0u : 1u);
  EXPECT_THROW(generate_batch(m, {{1, 2}, {1}}, o), std::invalid_argument);
}

namespace {
ModelConfig tiny_vit(const std::string& ffn = "gelu") {
  auto c = test::small_model(0, 16, 2, 4, 4);
  c.task = "classify";
  c.image_size = 8;
  c.patch_size = 4;
  c.num_classes = 3;
  c.ffn = ffn;
  c.ffn_hidden = 24;
  c.moe.dense_ffn = "gelu";
  c.moe.activation = Activation::GELU;
  c.moe.expert_bias = true;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_hidden = 12;
  return c;
}
}  // namespace

TEST(ViT, PatchifyMatchesPerPatchReference) {
  auto images = torch::randn({2, 3, 8, 12}, torch::kFloat64);
  auto p = patchify(images, 4);  // 2 x 3 patches of 3 x 4 x 4 values
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{2, 6, 48}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        auto ref = images[b].narrow(1, 4 * i, 4).narrow(2, 4 * j, 4).reshape({-1});  // channels, rows, columns
        EXPECT_TRUE(torch::equal(p[b][i * 3 + j], ref)) << b << " " << i << " " << j;
      }
}

TEST(ViT, ConvStemMatchesPerPixelReference) {
  ConvStem stem(2, 3);
  stem->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    stem->weight.normal_();
    stem->bias.normal_();
  }
  auto x = torch::randn({2, 2, 5, 6}, torch::kFloat64);
  auto y = stem->forward(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 5, 6}));
  auto w = stem->weight.detach();
  auto xa = x.accessor<double, 4>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 6; ++j) {
          double acc = stem->bias[s].item<double>();
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t u = 0; u < 3; ++u)
              for (int64_t v = 0; v < 3; ++v) {
                const int64_t r = i + u - 1, q = j + v - 1;  // zero outside the image
                if (r >= 0 && r < 5 && q >= 0 && q < 6) acc += w[s][c * 9 + u * 3 + v].item<double>() * xa[b][c][r][q];
              }
          const double gelu = 0.5 * acc * (1.0 + std::erf(acc / std::sqrt(2.0)));
          EXPECT_NEAR(y[b][s][i][j].item<double>(), gelu, 1e-12) << b << s << i << j;
        }
}

TEST(ViT, AttentionSeesLaterTokens) {
  torch::manual_seed(1);
  ViTAttention attn(16, 4);
  auto x = torch::randn({1, 5, 16});
  auto y = attn->forward(x);
  auto x2 = x.clone();
  x2[0][4] += 1.0;  // the last token
  auto y2 = attn->forward(x2);
  EXPECT_GT((y2[0][0] - y[0][0]).abs().max().item<double>(), 1e-4);  // no causal mask: token 0 changes
}

TEST(ViT, AttentionAndLayerNormMatchTheirFormulas) {
  torch::manual_seed(3);
  const int64_t D = 12, H = 3, Dh = 4, T = 5;
  ViTAttention attn(D, H);
  attn->to(torch::kFloat64);
  auto x = torch::randn({2, T, D}, torch::kFloat64);
  // per head h: softmax(q_h k_h^T / sqrt(Dh)) v_h, heads concatenated, then proj
  auto qkv = torch::matmul(x, attn->qkv->weight.t()) + attn->qkv->bias;
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    auto q = qkv.narrow(-1, h * Dh, Dh), k = qkv.narrow(-1, D + h * Dh, Dh), v = qkv.narrow(-1, 2 * D + h * Dh, Dh);
    heads.push_back(torch::matmul(torch::softmax(torch::matmul(q, k.transpose(1, 2)) / std::sqrt(4.0), -1), v));
  }
  auto ref = torch::matmul(torch::cat(heads, -1), attn->proj->weight.t()) + attn->proj->bias;
  EXPECT_TRUE(torch::allclose(attn->forward(x), ref, 1e-12, 1e-12));
  LayerNorm norm(D, 1e-5);
  norm->to(torch::kFloat64);
  {
    torch::NoGradGuard g;
    norm->weight.normal_();
    norm->bias.normal_();
  }
  auto mean = x.mean(-1, true), var = (x - mean).pow(2).mean(-1, true);  // biased variance
  EXPECT_TRUE(torch::allclose(norm->forward(x), (x - mean) / torch::sqrt(var + 1e-5) * norm->weight + norm->bias, 1e-12,
                              1e-12));
}

TEST(ViT, EveryFfnKindBuildsAndTrainsOneStep) {
  std::vector<std::pair<std::string, ModelConfig>> kinds;
  kinds.emplace_back("dense gelu", tiny_vit());
  kinds.emplace_back("top-2 MoE", tiny_vit("moe"));
  auto alternate = tiny_vit("moe");
  alternate.moe.layers = "every_other";
  kinds.emplace_back("MoE in alternate blocks", alternate);
  auto unipool = tiny_vit("moe");
  unipool.moe.router = RouterKind::NormTopK;
  unipool.moe.section<UniPoolConfig>().groups = 1;
  unipool.moe.section<UniPoolConfig>().aux_loss_coef = 0.01;
  kinds.emplace_back("UniPool", unipool);
  auto latent = tiny_vit("moe");
  latent.moe.section<LatentConfig>().shapes = "8,12,4,2,16";
  kinds.emplace_back("LatentMoE", latent);
  auto unif = tiny_vit("moe");
  unif.moe.section<UniFConfig>().blocks = 2;
  kinds.emplace_back("UniF-MoE", unif);
  auto stem = tiny_vit();
  stem.stem_channels = 3;
  kinds.emplace_back("dense with a convolution stem", stem);
  for (auto& [name, c] : kinds) {
    torch::manual_seed(2);
    VisionTransformer m(c);
    m->init_weights(3);
    auto images = torch::randn({4, 1, 8, 8});
    auto labels = torch::tensor({0, 1, 2, 1}, torch::kLong);
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2));
    AuxLosses aux;
    auto logits = m->forward(images, aux);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{4, 3})) << name;
    auto loss = classify_loss(logits, labels);
    if (auto a = aux.total(); a.defined()) loss = loss + a;
    loss.backward();
    opt.step();
    EXPECT_TRUE(std::isfinite(loss.item<double>())) << name;
    EXPECT_EQ(moe_layers(m->feed_forwards()).empty(), c.ffn == "gelu") << name;
    if (c.stem_channels > 0) {
      EXPECT_GT(m->stem->weight.grad().abs().sum().item<double>(), 0) << name;
    }
  }
}

TEST(ViT, FlipAverageIsTheMeanOverTheMirrorImageAndMirrorInvariant) {
  torch::manual_seed(6);
  auto c = tiny_vit();
  c.stem_channels = 2;
  VisionTransformer m(c);
  m->to(torch::kFloat64);
  m->init_weights(7);
  m->eval();
  torch::NoGradGuard g;
  auto images = torch::randn({3, 1, 8, 8}, torch::kFloat64);
  auto mirror = images.flip({3});  // columns reversed: x'[.., i, j] = x[.., i, W - 1 - j]
  int forwards = 0;
  auto averaged = classify_logits(*m, images, true, [&] { ++forwards; });
  EXPECT_EQ(forwards, 2);
  EXPECT_TRUE(torch::allclose(averaged, (m->forward(images) + m->forward(mirror)) / 2, 1e-12, 1e-12));
  // a prediction that cannot tell an image from its mirror image, unlike the plain forward
  EXPECT_TRUE(torch::allclose(classify_logits(*m, mirror, true), averaged, 1e-12, 1e-12));
  EXPECT_GT((m->forward(mirror) - m->forward(images)).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(torch::equal(classify_logits(*m, images, false), m->forward(images)));
}

TEST(ViT, LabelSmoothingLossByHand) {
  // p = softmax(ln 3, 0) = (0.75, 0.25); label 0 with eps = 0.2: targets (0.9, 0.1)
  auto logits = torch::tensor({{std::log(3.0), 0.0}}, torch::kFloat64);
  auto label = torch::tensor({0}, torch::kLong);
  EXPECT_NEAR(classify_loss(logits, label, 0.2).item<double>(), -(0.9 * std::log(0.75) + 0.1 * std::log(0.25)), 1e-12);
  EXPECT_NEAR(classify_loss(logits, label).item<double>(), -std::log(0.75), 1e-12);
}

TEST(ViT, OverfitsSixtyFourImages) {
  torch::manual_seed(4);
  auto c = tiny_vit();
  c.d_model = 32;
  c.ffn_hidden = 64;
  c.num_classes = 10;
  VisionTransformer m(c);
  m->init_weights(5);
  auto images = torch::randn({64, 1, 8, 8});
  auto labels = torch::randint(0, 10, {64}, torch::kLong);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-3));
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    classify_loss(m->forward(images), labels).backward();
    opt.step();
  }
  const double accuracy = (m->forward(images).argmax(-1) == labels).to(torch::kDouble).mean().item<double>();
  EXPECT_EQ(accuracy, 1.0);
}

// info's counts for models larger than memory (one block at a time) equal the whole model's.
TEST(ParamCounts, BlockwiseEqualsTheWholeModel) {
  auto moe = test::small_moe(50, 16, 3, 4, 2, 12);
  moe.moe.layers = "1,2";
  moe.moe.shared_hidden = 20;
  moe.moe.shared_gate = true;
  moe.qkv_bias = true;
  moe.qk_norm = "head";
  moe.head_dim = 6;
  auto dense = test::small_model(50, 16, 2);
  dense.tie_embeddings = true;
  dense.qk_norm = "full";
  dense.o_bias = true;
  for (const auto& c : {moe, dense}) {
    const auto whole = TransformerLM(c)->param_counts();
    const auto blockwise = blockwise_param_counts(c);
    ASSERT_TRUE(blockwise.has_value());
    EXPECT_EQ(blockwise->total, whole.total);
    EXPECT_EQ(blockwise->active, whole.active);
    EXPECT_EQ(blockwise->embedding, whole.embedding);
    EXPECT_EQ(blockwise->non_embedding, whole.non_embedding);
    EXPECT_EQ(blockwise->expert_stored, whole.expert_stored);
    EXPECT_EQ(blockwise->router, whole.router);
  }
  auto gelu = dense;
  gelu.ffn = "gelu";
  EXPECT_FALSE(blockwise_param_counts(gelu).has_value());
}

// The one-pass cross-entropy rows: a closed form, then the kernel against the composed ops on
// rows with wide and extreme logits, in float64 and float32 (every SIMD level: ctest's
// kernels_simd_* run this too).
TEST(CrossEntropyRows, TwoLogitsByHand) {
  auto z = torch::tensor({{0.0, std::log(3.0)}}, torch::kFloat64);
  const auto loss = cross_entropy_rows_(z, torch::tensor({1}), 0.5);
  EXPECT_NEAR(loss.item<double>(), std::log(4.0 / 3.0), 1e-15);  // lse = log 4, z_t = log 3
  EXPECT_NEAR(z[0][0].item<double>(), 0.5 * 0.25, 1e-15);        // softmax (1/4, 3/4) minus (0, 1), times 1/2
  EXPECT_NEAR(z[0][1].item<double>(), 0.5 * (0.75 - 1.0), 1e-15);
}

TEST(CrossEntropyRows, KernelEqualsTheComposedOps) {
  torch::manual_seed(12);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (int64_t V : {1, 7, 33, 1000}) {
      const int64_t n = 5;
      auto z = (torch::randn({n, V}, torch::kFloat64) * 30).to(dtype);
      z[1].fill_(-1e4), z[2][0] = 80;  // all-equal and dominated rows
      const auto t = torch::randint(0, V, {n}, torch::kLong);
      t[0] = V - 1;
      auto fast = z.clone(), ref = z.clone();
      const auto loss = cross_entropy_rows_(fast, t, 0.25), want = cross_entropy_rows_composed_(ref, t, 0.25);
      const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-5;
      const auto what = std::string(dtype == torch::kFloat64 ? "float64" : "float32") + " V=" + std::to_string(V);
      EXPECT_TRUE(torch::allclose(loss, want, tol, tol)) << what << "\n" << loss << want;
      EXPECT_TRUE(torch::allclose(fast, ref, tol, tol)) << what;
    }
  auto z = torch::zeros({2, 4});
  EXPECT_THROW(
      {
        try {
          cross_entropy_rows_(z, torch::tensor({0, 4}), 1.0);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("target 4 is outside the vocabulary [0, 4)"), std::string::npos);
          throw;
        }
      },
      c10::Error);
}

// The loss fused with the head equals logits + cross entropy in float64, in value and in the
// gradients of hidden states and head, for chunks that do and do not divide N, and under a
// scaled upstream gradient (grad_accum, aux losses).
TEST(FusedLoss, EqualsLogitsThenCrossEntropyInValueAndGradients) {
  torch::manual_seed(3);
  const int64_t N = 10, D = 6, V = 13;
  const auto opts = torch::dtype(torch::kFloat64);
  const auto h0 = torch::randn({N, D}, opts), w0 = torch::randn({V, D}, opts);
  const auto t = torch::randint(0, V, {N}, torch::kLong);
  auto h_ref = h0.clone().requires_grad_(), w_ref = w0.clone().requires_grad_();
  auto ref = lm_loss(torch::matmul(h_ref, w_ref.t()).unsqueeze(0), t.unsqueeze(0));
  (0.25 * ref).backward();
  for (int64_t chunk : {1, 3, 7, 10, 64}) {
    auto h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    auto loss = fused_lm_loss(h, w, t, chunk);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-12) << chunk;
    (0.25 * loss).backward();
    EXPECT_TRUE(torch::allclose(h.grad(), h_ref.grad(), 1e-12, 1e-12)) << chunk;
    EXPECT_TRUE(torch::allclose(w.grad(), w_ref.grad(), 1e-12, 1e-12)) << chunk;
  }
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(fused_lm_loss(h0, w0, t, 4).item<double>(), ref.item<double>(), 1e-12);
}

// In float32 with the head's products on our unit GEMMs (pinned; chunks of 40 rows and a last
// of 20, which falls back to LibTorch's): the float64 loss and gradients to float32 rounding.
TEST(FusedLoss, Float32OnUnitGemmsMatchesFloat64) {
  torch::manual_seed(4);
  force_unit_gemm(true);
  const int64_t N = 100, D = 24, V = 50;
  const auto h0 = torch::randn({N, D}), w0 = torch::randn({V, D});
  const auto t = torch::randint(0, V, {N}, torch::kLong);
  auto h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  auto h64 = h0.to(torch::kFloat64).requires_grad_(), w64 = w0.to(torch::kFloat64).requires_grad_();
  auto loss = fused_lm_loss(h, w, t, 40);
  loss.backward();
  auto loss64 = fused_lm_loss(h64, w64, t, 40);
  loss64.backward();
  force_unit_gemm(std::nullopt);
  EXPECT_NEAR(loss.item<double>(), loss64.item<double>(), 1e-5);
  EXPECT_TRUE(torch::allclose(h.grad().to(torch::kFloat64), h64.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(w.grad().to(torch::kFloat64), w64.grad(), 1e-4, 1e-6));
}

// Training through the fused loss is training through the logits: one model, both losses.
TEST(FusedLoss, ModelHiddenAndHeadGiveTheForwardLogitsLoss) {
  auto c = test::small_moe(50, 16, 2, 4, 2, 8);
  c.tie_embeddings = true;
  TransformerLM m(c);
  m->to(torch::kFloat64);
  const auto tokens = torch::randint(0, 50, {2, 5}, torch::kLong),
             targets = torch::randint(0, 50, {2, 5}, torch::kLong);
  AuxLosses a1, a2;
  const auto h = m->hidden(tokens, a1);
  const auto fused = fused_lm_loss(h.reshape({-1, 16}), m->head_weight(), targets.reshape({-1}));
  const auto plain = lm_loss(m->forward(tokens, a2), targets);
  EXPECT_NEAR(fused.item<double>(), plain.item<double>(), 1e-12);
}
