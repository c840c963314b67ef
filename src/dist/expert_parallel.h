// Expert parallelism around the engine's dispatcher. Each of W ranks owns E / W consecutive
// experts of every MoE layer (or UniPool pool); dispatch() sorts a rank's (token, expert) pairs
// by expert as always, and the bank it calls is this wrapper, which
//   1. sends each pair's row to the rank owning its expert (all-to-all, variable splits),
//   2. runs the owner's local grouped kernels on what it received, regrouped by expert,
//   3. sends the outputs back the same way (the split sizes swapped),
// so routing, capacity, combine and every statistic stay the single-process code. The backward
// of an all-to-all is the all-to-all with the splits swapped (an autograd function here).
//
// Memory is sharded too: each rank keeps only its experts' rows of the bank's parameters (and
// so of their gradients and AdamW moments). Their gradients are complete where they live: the
// exchange's backward brings every token's gradient to the owner. So every forward through the
// bank, training or not, is a collective: all ranks evaluate and sample together.
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

// Keeps this rank's rows [rank·E/W, (rank+1)·E/W) of every parameter of `bank`, in place: the
// parameters keep their identity, so the module and the optimizer hold the slices. Returns them.
// Throws (naming model.moe.num_experts) when E does not split evenly over W.
std::vector<at::Tensor> shard_bank(ExpertBank& bank, int rank, int world);

class ExpertParallelBank : public UnitBank {
 public:
  // `bank` already sharded over `group` (shard_bank); it still reports all E units
  ExpertParallelBank(std::shared_ptr<ExpertBank> bank, DataParallel& group);
  int64_t num_units() const override { return bank_->num_units(); }
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) override;
  // no combined path (offers_combined() is false): dispatch() takes the grouped path, which
  // exchanges the rows with the experts' owners
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override;
  int64_t first_owned() const { return group_.rank() * owned_; }
  int64_t owned() const { return owned_; }

 private:
  std::shared_ptr<ExpertBank> bank_;
  DataParallel& group_;
  int64_t owned_;  // experts per rank
};

// Float64, on every rank of `group`: one MoE layer (2 experts per rank, top-2, SwiGLU) on
// T tokens per rank, through dispatch() with the expert-parallel bank over the sharded experts,
// against the same layer, whole, on all W * T tokens in this process: the rank's output rows,
// its input gradient and its experts' gradients, in training and in evaluation. Returns the
// largest absolute difference; throws when it exceeds 1e-10.
double check_expert_parallel(DataParallel& group, int64_t tokens = 24);

struct ExpertParallel {
  int64_t layers = 0;               // MoE slots routed through an ExpertParallelBank
  std::vector<at::Tensor> sharded;  // the slices this rank keeps (each shared bank once)
  int64_t whole = 0;                // parameters of those banks, all ranks together
};

// Shards every MoE slot's experts (a UniPool pool once) over `group` and routes the slot
// through an ExpertParallelBank. Throws a ConfigError naming model.moe.num_experts when E is
// not a multiple of the world size.
ExpertParallel enable_expert_parallel(const std::vector<std::shared_ptr<FeedForward>>& ffns, DataParallel& group);

}  // namespace mf
