// What the trainer needs from a data-parallel group, so that train/ stays single-process code
// and dist/ (c10d) plugs in from outside. With a group of W ranks, rank r takes the
// micro-batches m with m % W == r of each step (train.grad_accum must be a multiple of W):
// the global batch is the same set of windows whatever the world size.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace mf {

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place, every rank ends with the sum over ranks (gradients, loads, loss sums).
  virtual void sum(std::vector<at::Tensor>& tensors) = 0;
  // Starts summing `tensors` over ranks in place and returns at once; finish_sums() waits for
  // every sum started since the last finish_sums(). These sums run on a channel of their own, so
  // they may overlap the other collectives (e.g. expert parallelism's exchange inside the
  // backward); every rank must start them in the same order.
  virtual void start_sum(std::vector<at::Tensor> tensors) = 0;
  virtual void finish_sums() = 0;
  // In place, every rank ends with rank 0's values (the parameters at the start).
  virtual void broadcast(std::vector<at::Tensor>& tensors) = 0;
  virtual void barrier() = 0;
  // Rows of `in` go to the ranks in order (in_rows[r] of them to rank r); `out` receives
  // out_rows[r] rows from rank r. Variable splits: the exchange of expert parallelism.
  virtual void all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_rows,
                          std::vector<int64_t> in_rows) = 0;
  // Seconds spent in communication since the last call (metrics: comm_s per step).
  virtual double take_comm_seconds() = 0;
};

// In place, every tensor becomes its mean over the group's ranks (HasRankState's round sync).
inline void average_over_ranks(DataParallel& group, std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  group.sum(tensors);
  for (auto& t : tensors) t.div_(group.world());
}

}  // namespace mf
