// What the trainer does across ranks (train/parallel.h): data parallel's sums after the
// backward, and expert parallelism's memory sharding (Distributed::sharded): rank r of W holds
// rows [r·n, (r+1)·n) of dim 0 of each sharded parameter, of its gradient and of its AdamW
// moments; every other parameter is replicated and kept identical by the sums.
#pragma once
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <unordered_set>
#include <vector>

#include "io/safetensors.h"

namespace mf {

class DataParallel;
class GradOverlap;
class MoEFeedForward;

// Data parallel: sums the gradients of the replicated `params` (unless `overlap` summed them
// during the backward), the MoE layers' pending loads and the loss over ranks. A gradient no rank
// has stays undefined, so AdamW skips that parameter as one process would.
double sum_over_ranks(DataParallel& par, const std::vector<at::Tensor>& params,
                      const std::vector<std::shared_ptr<MoEFeedForward>>& moe, double loss_sum, GradOverlap* overlap);

// whether `t` is one of `list` (the same tensor, not equal values)
bool is_among(const at::Tensor& t, const std::vector<at::Tensor>& list);
// `params` without those in `sharded` (the ones data parallel sums), in order.
std::vector<at::Tensor> without(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& sharded);

// AdamW moments of whole parameters (read from a checkpoint) cut to this rank's slices.
void narrow_optimizer_state(torch::optim::AdamW& opt, const std::vector<at::Tensor>& sharded, int rank);

// clip_grad_norm_ when the sharded gradients are split over the ranks: the norm of all gradients
// is sqrt(Σ replicated |g|² + Σ over ranks Σ sharded |g|²), the same on every rank; every gradient
// is scaled by max_norm / (norm + 1e-6) when that is below 1. Returns the norm.
double clip_grad_norm(DataParallel& group, const std::vector<at::Tensor>& replicated,
                      const std::vector<at::Tensor>& sharded, double max_norm);

// Before a checkpoint write, on every rank: each entry of `tensors` named in `sharded` is gathered
// whole onto the rank that will store it (shard_plan's over the whole shapes, or rank 0 when
// `to_rank0`); the other ranks get a placeholder of the whole shape without storage (meta
// device), which the writers only measure.
void gather_for_writing(DataParallel& group, NamedTensors& tensors, const std::unordered_set<std::string>& sharded,
                        bool to_rank0);

}  // namespace mf
