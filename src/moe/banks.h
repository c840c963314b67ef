// Unit banks own what a routed "unit" computes. The dispatcher hands a bank its rows
// grouped by unit; banks know nothing of routers.
#pragma once
#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace mf {

class UnitBank : public torch::nn::Module {
 public:
  virtual int64_t num_units() const = 0;
  // rows [N, d] sorted by unit, counts[u] rows for unit u in order -> outputs [N, d]
  virtual at::Tensor forward_grouped(const at::Tensor& rows, const std::vector<int64_t>& counts) = 0;
  // one unit on arbitrary rows (dense reference, probes)
  virtual at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) = 0;
};

// E FFN experts stored stacked, in the layout HF v5 and torchtitan use:
//   gate_up_proj [E, 2F, D] (gate rows first, then up), down_proj [E, D, F].
// SwiGLU: down (silu(gate x) * up x), gate_up_proj [E, 2F, D];  GELU: down gelu(W x), [E, F, D].
class ExpertBank : public UnitBank {
 public:
  ExpertBank(int64_t num_experts, int64_t d_model, int64_t hidden, std::string activation = "swiglu",
             bool bias = false);
  int64_t num_units() const override { return num_experts_; }
  at::Tensor forward_grouped(const at::Tensor& rows, const std::vector<int64_t>& counts) override;
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override;

  at::Tensor gate_up_proj, down_proj;
  at::Tensor gate_up_proj_bias, down_proj_bias;  // [E, 2F|F], [E, D]; undefined without biases

 private:
  int64_t num_experts_, hidden_;
  std::string activation_;
};

}  // namespace mf
