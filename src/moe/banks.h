// Unit banks own what a routed "unit" computes. The dispatcher hands a bank its rows
// grouped by unit; banks know nothing of routers.
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/param_roles.h"

namespace mf {

class UnitPack;

class UnitBank : public torch::nn::Module {
 public:
  virtual int64_t num_units() const = 0;
  // rows_PD sorted by unit, counts_E[u] rows for unit u in order -> outputs [P, D]
  virtual at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) = 0;
  // one unit on arbitrary rows (dense reference, probes)
  virtual at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) = 0;
  // Work a bank does once per token, shared by all of the token's units (e.g. a projection of
  // x): x_TD -> side_TS, or undefined for none. dispatch() gathers its rows like x's and calls
  // the three-argument forward_grouped.
  virtual at::Tensor per_token(const at::Tensor& x_TD) { return {}; }
  virtual at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E, const at::Tensor& side_PS) {
    return forward_grouped(rows_PD, counts_E);
  }
  // y_TD = sum over pairs of weight_P * unit_P(x[token_P]), pairs sorted by unit (counts_E per
  // unit), gathered and combined chunk by chunk (moe/combined_ffn.h; differentiable), or with
  // `fused` (no grad) by the kernel of moe/fused_units.h. Offered only by banks that say so (not by one
  // with a per-token side input, nor by expert parallelism); dispatch() chooses (units_path).
  virtual bool offers_combined() const { return false; }
  virtual UnitPack* unit_pack() const { return nullptr; }  // the fused kernel's packed weights; null: no fused path
  virtual at::Tensor forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                      const at::Tensor& counts_E, bool fused) {
    TORCH_CHECK(false, "this unit bank has no inference path");
  }
};

// E FFN experts stored stacked, in the layout HF v5 and torchtitan use:
//   gate_up_proj [E, 2F, D] (gate rows first, then up), down_proj [E, D, F].
// SwiGLU: down (silu(gate x) * up x), gate_up_proj [E, 2F, D];  GELU: down gelu(W x), [E, F, D].
class ExpertBank : public UnitBank, public DeclaresParamRoles {
 public:
  ExpertBank(int64_t num_experts, int64_t d_model, int64_t expert_hidden, Activation activation = Activation::SwiGLU,
             bool bias = false);
  int64_t num_units() const override { return num_experts_; }
  int64_t expert_hidden() const { return expert_hidden_; }
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) override;
  bool offers_combined() const override { return true; }
  at::Tensor forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                              const at::Tensor& counts_E, bool fused) override;
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override;
  // block b of G of expert e on rows, without the output bias (see ExpertBlocks)
  at::Tensor forward_block(int64_t e, int64_t b, int64_t blocks, const at::Tensor& rows);
  Activation activation() const { return activation_; }
  ParamRoleList param_roles() const override;
  int64_t parameter_count() const;
  // the inference kernel's packed copy of the weights (moe/fused_units.h), kept while they do not change;
  // none for weights held in bf16 (model/weight_dtype.h): a float32 pack would undo the saving
  UnitPack* unit_pack() const override { return gate_up_proj.scalar_type() == at::kFloat ? pack_.get() : nullptr; }

  at::Tensor gate_up_proj, down_proj;            // gate_up_E2FD (or _EFD for GELU), down_EDF
  at::Tensor gate_up_proj_bias, down_proj_bias;  // [E, 2F|F], [E, D]; undefined without biases

 private:
  int64_t num_experts_, expert_hidden_;
  Activation activation_;
  std::shared_ptr<UnitPack> pack_;
};

// The (expert, block) units of an ExpertBank: each expert's hidden width F is split into G
// aligned blocks of F / G channels (gate, up and down together), unit u = (expert u / G,
// block u % G) computes that block's partial output. The activation acts per channel, so an
// expert's output is the sum of its G blocks plus its output bias, which is not part of any
// block: whoever combines blocks adds each expert's bias once (add_output_bias).
class ExpertBlocks : public UnitBank {
 public:
  ExpertBlocks(ExpertBank& bank, int64_t blocks);
  int64_t num_units() const override { return bank_.num_units() * blocks_; }
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_U) override;
  bool offers_combined() const override { return true; }
  UnitPack* unit_pack() const override { return bank_.unit_pack(); }
  at::Tensor forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                              const at::Tensor& counts_U, bool fused) override;
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override;
  // y_TD + sum_e w_TE[t, e] * down_bias[e] (unchanged without biases)
  at::Tensor add_output_bias(const at::Tensor& y_TD, const at::Tensor& w_TE) const;

 private:
  ExpertBank& bank_;
  int64_t blocks_;
};

}  // namespace mf
