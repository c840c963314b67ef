// Running state that data-parallel ranks must agree on although no gradient carries it (e.g.
// UniPool's one-step-behind pool fractions, measured on each rank's own micro-batches).
#pragma once
#include <torch/nn/module.h>

#include <vector>

namespace mf {

// Implemented by modules holding such state. After every round of micro-batches (one per rank)
// the data-parallel trainer replaces each tensor, in place, by its mean over the ranks; with
// one process nothing changes.
class HasRankState {
 public:
  virtual ~HasRankState() = default;
  virtual std::vector<at::Tensor> rank_state() = 0;
};

// Every such tensor under `root`, in module order (the same on every rank).
inline std::vector<at::Tensor> collect_rank_state(torch::nn::Module& root) {
  std::vector<at::Tensor> state;
  for (auto& m : root.modules(/*include_self=*/true))
    if (auto* s = dynamic_cast<HasRankState*>(m.get()))
      for (auto& t : s->rank_state()) state.push_back(t);
  return state;
}

}  // namespace mf
