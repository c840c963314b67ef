// UniPool's pool-level balance loss (../shared/specs/unipool.md, component 4).
//   L_pool = alpha * M * sum_i fbar_i * Pbar_i,  fbar = mean over the pool's layers of the
//   pairs' share per expert (no grad), Pbar = mean over layers of the mean score per expert.
// Decomposed per layer so each term is available during that layer's forward:
//   L_pool = mean_l [ alpha * M * sum_i fbar_i * P_i^(l) ],
// with fbar taken one micro-batch behind: the fractions measured while every layer of the
// pool reported in micro-batch t-1. Before the first refresh fbar = 0, so the loss is 0.
// The spec's M (pool size) is E in tensor names: the experts every router chooses among.
#pragma once
#include <torch/nn/module.h>

#include "core/rank_state.h"

namespace mf {

class PoolBalanceImpl : public torch::nn::Module, public HasRankState {
 public:
  PoolBalanceImpl(int64_t pool_size, int64_t num_layers, double alpha);
  // One layer's term alpha * M * <fbar, mean_t scores_TE>. When `record` (training with
  // gradients), the layer's pair counts join the next fbar. No device sync.
  at::Tensor layer_loss(const at::Tensor& scores_TE, const at::Tensor& unit_P, bool record);

  at::Tensor fraction;  // buffer [E]: fbar of the previous micro-batch (saved for exact resume)
  at::Tensor ready;     // buffer []: 1 once fbar has been measured (float, so casts and checkpoints keep it)
  // Data parallel: fbar becomes the mean over the ranks' previous micro-batches (one round)
  std::vector<at::Tensor> rank_state() override { return {fraction, ready}; }

 private:
  int64_t pool_size_, num_layers_;
  double alpha_;
  at::Tensor current_sum_E_;  // sum over the layers that reported so far of their fractions (float64)
  int64_t reported_ = 0;
};
TORCH_MODULE(PoolBalance);

// The undecomposed formula, for tests: alpha * M * sum_i fbar_i * Pbar_i.
at::Tensor pool_aux_loss(const at::Tensor& fbar_E, const at::Tensor& pbar_E, double alpha);

}  // namespace mf
