#include "moe/banks.h"

#include <torch/torch.h>

#include "moe/grouped_ffn.h"

namespace mf {

ExpertBank::ExpertBank(int64_t E, int64_t d, int64_t F, std::string activation, bool bias)
    : num_experts_(E), hidden_(F), activation_(std::move(activation)) {
  TORCH_CHECK(activation_ == "swiglu" || activation_ == "gelu", "expert activation must be swiglu or gelu");
  const int64_t in_rows = activation_ == "swiglu" ? 2 * F : F;
  gate_up_proj = register_parameter("gate_up_proj", torch::randn({E, in_rows, d}) * 0.02);
  down_proj = register_parameter("down_proj", torch::randn({E, d, F}) * 0.02);
  if (bias) {
    gate_up_proj_bias = register_parameter("gate_up_proj_bias", torch::zeros({E, in_rows}));
    down_proj_bias = register_parameter("down_proj_bias", torch::zeros({E, d}));
  }
}

at::Tensor ExpertBank::forward_unit(int64_t e, const at::Tensor& rows) {
  auto h = torch::matmul(rows, gate_up_proj[e].t());  // [n, 2F] or [n, F]
  if (gate_up_proj_bias.defined()) h = h + gate_up_proj_bias[e];
  at::Tensor act;
  if (activation_ == "swiglu") act = torch::silu(h.narrow(1, 0, hidden_)) * h.narrow(1, hidden_, hidden_);
  else act = torch::gelu(h);
  auto y = torch::matmul(act, down_proj[e].t());  // [n, d]
  return down_proj_bias.defined() ? y + down_proj_bias[e] : y;
}

at::Tensor ExpertBank::forward_grouped(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  return grouped_ffn(rows, gate_up_proj, down_proj, counts, activation_ == "swiglu", gate_up_proj_bias, down_proj_bias);
}

}  // namespace mf
