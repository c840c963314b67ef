#include "moe/banks.h"

#include <torch/torch.h>

#include "moe/grouped_ffn.h"

namespace mf {

ExpertBank::ExpertBank(int64_t E, int64_t D, int64_t F, Activation activation, bool bias)
    : num_experts_(E), expert_hidden_(F), activation_(activation) {
  const int64_t in_rows = activation_ == Activation::SwiGLU ? 2 * F : F;
  gate_up_proj = register_parameter("gate_up_proj", torch::randn({E, in_rows, D}) * 0.02);
  down_proj = register_parameter("down_proj", torch::randn({E, D, F}) * 0.02);
  if (bias) {
    gate_up_proj_bias = register_parameter("gate_up_proj_bias", torch::zeros({E, in_rows}));
    down_proj_bias = register_parameter("down_proj_bias", torch::zeros({E, D}));
  }
}

ParamRoleList ExpertBank::param_roles() const {
  return {
      {"down_proj", ParamRole::Output}, {"gate_up_proj_bias", ParamRole::Bias}, {"down_proj_bias", ParamRole::Bias}};
}

int64_t ExpertBank::parameter_count() const {
  int64_t n = gate_up_proj.numel() + down_proj.numel();
  if (gate_up_proj_bias.defined()) n += gate_up_proj_bias.numel() + down_proj_bias.numel();
  return n;
}

at::Tensor ExpertBank::forward_unit(int64_t e, const at::Tensor& rows) {
  auto h = torch::matmul(rows, gate_up_proj[e].t());  // [n, 2F] or [n, F]
  if (gate_up_proj_bias.defined()) h = h + gate_up_proj_bias[e];
  at::Tensor act;
  if (activation_ == Activation::SwiGLU)
    act = torch::silu(h.narrow(1, 0, expert_hidden_)) * h.narrow(1, expert_hidden_, expert_hidden_);
  else
    act = torch::gelu(h);
  auto y = torch::matmul(act, down_proj[e].t());  // [n, D]
  return down_proj_bias.defined() ? y + down_proj_bias[e] : y;
}

at::Tensor ExpertBank::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) {
  return grouped_ffn(rows_PD, gate_up_proj, down_proj, counts_E, activation_ == Activation::SwiGLU, gate_up_proj_bias,
                     down_proj_bias);
}

}  // namespace mf
