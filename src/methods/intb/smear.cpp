#include "methods/intb/smear.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/config_keys.h"
#include "methods/intb/intb.h"
#include "model/method_info.h"

namespace mf {

SmearFeedForward::SmearFeedForward(int64_t d, int64_t E, int64_t F, Activation act, bool bias, bool example)
    : example_(example) {
  gate = register_parameter("router", torch::empty({E, d}));
  experts = register_module("experts", std::make_shared<ExpertBank>(E, d, F, act, bias));
}

at::Tensor SmearFeedForward::probs(const at::Tensor& x) const {
  const auto dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // router math in fp32
  auto x_BLD = x.dim() == 3 ? x : x.unsqueeze(0);
  auto r = example_ ? x_BLD.mean(1, /*keepdim=*/true) : x_BLD;  // example level: the sample's mean token
  auto p = torch::nn::functional::linear(r.to(dtype), gate.to(dtype)).softmax(-1);
  return p.expand({x_BLD.size(0), x_BLD.size(1), p.size(-1)});
}

// The merged expert on every token: pre = sum_e p_te (W1_e x_t + b1_e); h = act(pre);
// y = sum_e p_te (W2_e h_t + b2_e). Linear in the weights, so each sum runs over the E outputs.
torch::Tensor SmearFeedForward::forward(const torch::Tensor& x, AuxLosses& aux) {
  if (example_ && x.dim() == 3) return forward_per_sample(x);
  auto x_TD = x.reshape({-1, x.size(-1)});
  auto p_TE = probs(x).reshape({x_TD.size(0), -1}).to(x.dtype());
  const auto& b = *experts;
  auto pre_TEF = torch::einsum("td,efd->tef", {x_TD, b.gate_up_proj});
  if (b.gate_up_proj_bias.defined()) pre_TEF = pre_TEF + b.gate_up_proj_bias.unsqueeze(0);
  auto pre_TF = (p_TE.unsqueeze(-1) * pre_TEF).sum(1);
  const int64_t F = b.expert_hidden();
  auto h_TF = b.activation() == Activation::SwiGLU ? torch::silu(pre_TF.narrow(1, 0, F)) * pre_TF.narrow(1, F, F)
                                                   : torch::gelu(pre_TF);
  auto down_TED = torch::einsum("tf,edf->ted", {h_TF, b.down_proj});
  if (b.down_proj_bias.defined()) down_TED = down_TED + b.down_proj_bias.unsqueeze(0);
  return (p_TE.unsqueeze(-1) * down_TED).sum(1).view(x.sizes());
}

// Example level, the same function with sample b's expert materialised: W1_b = sum_e p_be W1_e,
// pre = W1_b x_t + sum_e p_be b1_e; y = W2_b act(pre) + sum_e p_be b2_e.
torch::Tensor SmearFeedForward::forward_per_sample(const torch::Tensor& x_BLD) {
  auto p_BE = probs(x_BLD).select(1, 0).to(x_BLD.dtype());
  const auto& b = *experts;
  auto w1_BFD = torch::einsum("be,efd->bfd", {p_BE, b.gate_up_proj});
  auto pre_BLF = torch::matmul(x_BLD, w1_BFD.transpose(1, 2));
  if (b.gate_up_proj_bias.defined()) pre_BLF = pre_BLF + p_BE.matmul(b.gate_up_proj_bias).unsqueeze(1);
  const int64_t F = b.expert_hidden();
  auto h_BLF = b.activation() == Activation::SwiGLU ? torch::silu(pre_BLF.narrow(2, 0, F)) * pre_BLF.narrow(2, F, F)
                                                    : torch::gelu(pre_BLF);
  auto w2_BDF = torch::einsum("be,edf->bdf", {p_BE, b.down_proj});
  auto y_BLD = torch::matmul(h_BLF, w2_BDF.transpose(1, 2));
  if (b.down_proj_bias.defined()) y_BLD = y_BLD + p_BE.matmul(b.down_proj_bias).unsqueeze(1);
  return y_BLD;
}

void register_smear() {
  register_config_keys({key_at<std::string>(
      "model.moe.smear.routing", [](Config & c) -> auto& { return c.model.moe.section<SmearConfig>().routing; },
      "SMEAR baseline (model.ffn = \"smear\"): route per token (causal), per example (the sample's mean token) or "
      "auto (example for images, token for the LM); E = model.moe.num_experts experts of width "
      "model.moe.expert_hidden merged by the router's probabilities",
      1, 0, {"auto", "token", "example"})});
  register_config_validator([](const Config& c) {
    if (c.model.ffn != "smear") return;
    if (c.model.task == "lm" && c.model.moe.section<SmearConfig>().routing == "example")
      throw ConfigError(
          "model.moe.smear.routing = \"example\" would let an LM token see its sequence's future; use token");
    in_moe_layers(c.model, 0);  // a bad model.moe.layers pattern is a ConfigError here
  });
  register_ffn_kind("smear",
                    [](const ModelConfig& c, int64_t layer, const MoEPlan& plan) -> std::shared_ptr<FeedForward> {
                      if (!in_moe_layers(c, layer)) {
                        ModelConfig dense = c;
                        dense.ffn = c.moe.dense_ffn;
                        return make_feed_forward(dense, layer, plan);
                      }
                      const auto& routing = c.moe.section<SmearConfig>().routing;
                      const bool example = routing == "example" || (routing == "auto" && c.task == "classify");
                      return std::make_shared<SmearFeedForward>(c.d_model, c.moe.num_experts, c.moe.expert_hidden,
                                                                c.moe.activation, c.moe.expert_bias, example);
                    });
  MethodInfo info{"smear", "SMEAR", "SMEAR routing",
                  "Every expert's weights are merged by the router's probabilities into one expert per token or "
                  "example (model.moe.smear.routing)."};
  info.facts = {"model.moe.smear.routing"};
  info.enabled = [](const Config& c) { return c.model.ffn == "smear"; };
  register_method_info(std::move(info));
}

}  // namespace mf
