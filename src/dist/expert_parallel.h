// Expert parallelism around the engine's dispatcher. Each of W ranks owns E / W consecutive
// experts of every MoE layer (or UniPool pool); dispatch() sorts a rank's (token, expert) pairs
// by expert as always, and the bank it calls is this wrapper, which
//   1. sends each pair's row to the rank owning its expert (all-to-all, variable splits),
//   2. runs the owner's local grouped kernels on what it received, regrouped by expert,
//   3. sends the outputs back the same way (the split sizes swapped),
// so routing, capacity, combine and every statistic stay the single-process code. The backward
// of an all-to-all is the all-to-all with the splits swapped (an autograd function here).
//
// Parameters stay replicated on every rank (the trainer's all-reduce keeps them identical;
// gradients of the experts a rank does not own are zero there): the compute and the token
// exchange are sharded, the memory is not. Without grad or outside training (evaluation on
// rank 0 alone, generation) the wrapper computes locally, so no rank waits for a partner.
#pragma once
#include <memory>

#include "model/moe_ffn.h"
#include "moe/banks.h"
#include "train/parallel.h"

namespace mf {

// rows [P, D] -> [sum out_rows, D]: rank r's in_rows[q] rows go to rank q, out_rows[q] come from q;
// differentiable in rows
at::Tensor exchange_rows(DataParallel& group, const at::Tensor& rows, const std::vector<int64_t>& out_rows,
                         const std::vector<int64_t>& in_rows);

class ExpertParallelBank : public UnitBank {
 public:
  // throws when the bank's experts do not split evenly over the group
  ExpertParallelBank(std::shared_ptr<ExpertBank> bank, DataParallel& group);
  int64_t num_units() const override { return bank_->num_units(); }
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) override;
  at::Tensor forward_combined(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& weight_P,
                              const at::Tensor& counts_E) override {
    return bank_->forward_combined(x_TD, token_P, weight_P, counts_E);
  }
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override { return bank_->forward_unit(unit, rows); }
  int64_t first_owned() const { return group_.rank() * owned_; }
  int64_t owned() const { return owned_; }

 private:
  std::shared_ptr<ExpertBank> bank_;
  DataParallel& group_;
  int64_t owned_;  // experts per rank
};

// Routes every MoE slot of `ffns` through an ExpertParallelBank over `group`; returns how many
// slots. Throws a ConfigError naming model.moe.num_experts when E is not a multiple of the
// world size, and refuses slots whose method routes on its own (UniF-MoE's blocks, IntBMoE).
// Float64, on every rank of `group`: one MoE layer (2 experts per rank, top-2, SwiGLU) on
// T tokens per rank, through dispatch() with the expert-parallel bank, against the same layer
// on all W * T tokens in this process: the rank's output rows, its input gradient and the
// expert gradients summed over ranks. Returns the largest absolute difference; throws when it
// exceeds 1e-10.
double check_expert_parallel(DataParallel& group, int64_t tokens = 24);

int64_t enable_expert_parallel(const std::vector<std::shared_ptr<FeedForward>>& ffns, DataParallel& group);

}  // namespace mf
