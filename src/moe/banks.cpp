#include "moe/banks.h"

#include <torch/torch.h>

#include "core/bf16.h"
#include "core/init.h"
#include "moe/combined_ffn.h"
#include "moe/fused_units.h"
#include "moe/grouped_ffn.h"

namespace mf {

ExpertBank::ExpertBank(int64_t E, int64_t D, int64_t F, Activation activation, bool bias)
    : num_experts_(E), expert_hidden_(F), activation_(activation), pack_(std::make_shared<UnitPack>()) {
  const int64_t in_rows = activation_ == Activation::SwiGLU ? 2 * F : F;
  gate_up_proj = register_parameter("gate_up_proj", init_normal({E, in_rows, D}, 0.02));
  down_proj = register_parameter("down_proj", init_normal({E, D, F}, 0.02));
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

// The reference path: the block's channels taken by plain slicing (one block = the whole expert).
at::Tensor ExpertBank::forward_block(int64_t e, int64_t b, int64_t blocks, const at::Tensor& rows) {
  const int64_t F = expert_hidden_, M = F / blocks;
  const bool swiglu = activation_ == Activation::SwiGLU;
  auto block_rows = [&](const at::Tensor& t) {  // the block's rows of gate_up[e] (or its bias): gate, then up
    if (blocks == 1) return t;
    auto gate = t.narrow(0, b * M, M);
    return swiglu ? torch::cat({gate, t.narrow(0, F + b * M, M)}) : gate;
  };
  auto h = project(rows, block_rows(gate_up_proj[e]));  // [n, 2M] or [n, M]
  if (gate_up_proj_bias.defined()) h = h + block_rows(gate_up_proj_bias[e]);
  auto act = swiglu ? torch::silu(h.narrow(1, 0, M)) * h.narrow(1, M, M) : torch::gelu(h);
  return project(act, down_proj[e].narrow(1, b * M, M));  // [n, D]
}

at::Tensor ExpertBank::forward_unit(int64_t e, const at::Tensor& rows) {
  auto y = forward_block(e, 0, 1, rows);
  return down_proj_bias.defined() ? y + down_proj_bias[e] : y;
}

at::Tensor ExpertBank::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) {
  return grouped_ffn(rows_PD, gate_up_proj, down_proj, counts_E, activation_ == Activation::SwiGLU, gate_up_proj_bias,
                     down_proj_bias);
}

at::Tensor ExpertBank::forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                        const at::Tensor& counts_E, bool fused) {
  return grouped_ffn_combined(x_TD, token_P, weight_P, counts_E, gate_up_proj, down_proj,
                              activation_ == Activation::SwiGLU, gate_up_proj_bias, down_proj_bias, 1,
                              kCombinedChunkHidden, fused ? pack_.get() : nullptr);
}

ExpertBlocks::ExpertBlocks(ExpertBank& bank, int64_t blocks) : bank_(bank), blocks_(blocks) {
  TORCH_CHECK(blocks >= 1 && bank.expert_hidden() % blocks == 0, "expert blocks: ", blocks,
              " blocks do not divide the expert width ", bank.expert_hidden());
}

at::Tensor ExpertBlocks::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_U) {
  return grouped_ffn(rows_PD, bank_.gate_up_proj, bank_.down_proj, counts_U, bank_.activation() == Activation::SwiGLU,
                     bank_.gate_up_proj_bias, {}, blocks_);
}

at::Tensor ExpertBlocks::forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                                          const at::Tensor& counts_U, bool fused) {
  return grouped_ffn_combined(x_TD, token_P, weight_P, counts_U, bank_.gate_up_proj, bank_.down_proj,
                              bank_.activation() == Activation::SwiGLU, bank_.gate_up_proj_bias, {}, blocks_,
                              kCombinedChunkHidden, fused ? bank_.unit_pack() : nullptr);
}

at::Tensor ExpertBlocks::forward_unit(int64_t u, const at::Tensor& rows) {
  return bank_.forward_block(u / blocks_, u % blocks_, blocks_, rows);
}

at::Tensor ExpertBlocks::add_output_bias(const at::Tensor& y_TD, const at::Tensor& w_TE) const {
  if (!bank_.down_proj_bias.defined()) return y_TD;
  return at::addmm(y_TD, w_TE.to(y_TD.dtype()), bank_.down_proj_bias);
}

}  // namespace mf
