// `moeforge layer run`: every FFN-slot kind run alone from written weights gives what the slot
// gives inside its model (output, dx, every weight's gradient; float64), and bad weight files
// name the tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "io/layer_run.h"

using namespace mf;

namespace {

Config slot_config(const std::vector<std::string>& sets) {
  Config c;
  for (auto s : {"model.d_model=16", "model.n_layers=3", "model.n_heads=2", "model.n_kv_heads=2", "model.ffn_hidden=24",
                 "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_hidden=8"})
    apply_override(c, s);
  for (auto& s : sets) apply_override(c, s);
  validate(c);
  return c;
}

}  // namespace

TEST(LayerRun, EverySlotKindMatchesItsModel) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> kinds = {
      {"dense", {}},
      {"moe", {"model.ffn=moe", "model.moe.n_shared=1"}},
      {"unipool", {"model.ffn=moe", "model.moe.unipool.groups=1", "model.moe.router=norm_topk"}},
      {"latent", {"model.ffn=moe", "model.moe.latent.shapes=8,8,4,2,0"}},
      {"unif", {"model.ffn=moe", "model.moe.unif.blocks=4", "model.moe.top_k=1"}},
      {"intb", {"model.ffn=intb", "model.moe.intb.basis=3"}},
      {"smear", {"model.ffn=smear"}},
  };
  for (auto& [kind, sets] : kinds) {
    auto cfg = slot_config(sets);
    const int64_t layer = 2;  // UniPool: a block whose pool is registered on block 0
    auto original = build_layer_slot(cfg, layer, at::kDouble);
    SafetensorsData w;
    for (auto& [name, t] : original.tensors) w.tensors[name] = t.detach().clone();
    cfg.train.seed = 99;  // a different init, overwritten by the weights
    auto loaded = build_layer_slot(cfg, layer, at::kDouble);
    load_layer_weights(loaded, w, kind);
    auto x = torch::randn({2, 5, 16}, torch::kFloat64), dy = torch::randn({2, 5, 16}, torch::kFloat64);
    auto got = run_layer(loaded, x, dy);
    // the original slot through autograd
    original.slot->train();
    auto xr = x.clone().requires_grad_(true);
    AuxLosses aux;
    auto y = original.slot->forward(xr, aux);
    (y * dy).sum().backward();
    std::map<std::string, at::Tensor> out(got.begin(), got.end());
    EXPECT_TRUE(torch::allclose(out.at("y"), y, 1e-12, 1e-12)) << kind;
    EXPECT_TRUE(torch::allclose(out.at("dx"), xr.grad(), 1e-12, 1e-12)) << kind;
    int64_t grads = 0;
    for (auto& [name, t] : original.tensors) {
      if (!t.requires_grad()) continue;
      ++grads;
      auto want = t.grad().defined() ? t.grad() : torch::zeros_like(t);
      EXPECT_TRUE(torch::allclose(out.at("grad." + name), want, 1e-12, 1e-12)) << kind << " " << name;
    }
    EXPECT_GT(grads, 2) << kind;
    if (kind == "unipool") {
      EXPECT_TRUE(out.count("grad.experts.gate_up_proj")) << "the shared pool's gradient";
    }
  }
}

TEST(LayerRun, BadWeightsNameTheTensor) {
  auto cfg = slot_config({"model.ffn=moe"});
  auto s = build_layer_slot(cfg, 0);
  auto message = [&](const SafetensorsData& w) {
    try {
      load_layer_weights(s, w, "w.safetensors");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SafetensorsData good;
  for (auto& [name, t] : s.tensors) good.tensors[name] = t.clone();
  EXPECT_EQ(message(good), "");
  auto missing = good;
  missing.tensors.erase("gate.weight");
  EXPECT_NE(message(missing).find("'gate.weight'"), std::string::npos);
  auto extra = good;
  extra.tensors["surplus"] = torch::zeros({1});
  EXPECT_NE(message(extra).find("'surplus'"), std::string::npos);
  auto shape = good;
  shape.tensors["experts.down_proj"] = torch::zeros({2, 2});
  EXPECT_NE(message(shape).find("'experts.down_proj'"), std::string::npos);
  EXPECT_THROW(build_layer_slot(cfg, 7), ConfigError);
}
