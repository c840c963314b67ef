// Soft parameter merging (SMEAR, Muqeeth et al. 2023), IntBMoE's strongest baseline class, as
// an FFN-slot kind (model.ffn = "smear"): every token runs ONE expert whose weights are the
// router-probability-weighted average of all E experts' weights,
//   W_t = sum_e p_te W_e,   p_t = softmax(W_r r_t),
// with r_t the token itself (token level: causal, for the LM) or the mean of its sample's tokens
// (example level: images), as the IntBMoE paper runs it. Token level never materialises the merge:
// the merged weights act linearly, so W_t x = sum_e p_te (W_e x) (the cost of running all E);
// example level merges once per sample (B merges of E experts, then one FFN per token).
#pragma once
#include "core/config.h"
#include "model/layers.h"
#include "moe/banks.h"

namespace mf {

// [model.moe.smear]; E = model.moe.num_experts, width = model.moe.expert_hidden, activation and
// biases = model.moe.activation / expert_bias, the blocks = model.moe.layers.
struct SmearConfig : MethodSectionOf<SmearConfig> {
  std::string routing = "auto";  // token | example | auto (example for model.task = "classify", else token)
};

class SmearFeedForward : public FeedForward {
 public:
  SmearFeedForward(int64_t d_model, int64_t experts, int64_t hidden, Activation act, bool bias, bool example);
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  at::Tensor probs(const at::Tensor& x) const;  // p [B, L, E] for x [B, L, D] ([T, D]: one sample)

  at::Tensor gate;  // W_r [E, D], "router"
  std::shared_ptr<ExpertBank> experts;

 private:
  torch::Tensor forward_per_sample(const torch::Tensor& x_BLD);
  bool example_;
};

void register_smear();

}  // namespace mf
