// Data parallel's gradient sum overlapped with the backward (what c10d's Reducer does for
// PyTorch's DDP): the parameters fall into buckets of about kBucketBytes in reverse registration
// order, the order their gradients arrive in; when the last gradient of a bucket arrives during a
// step's last backward, that bucket's sum over ranks starts while the backward goes on. Buckets
// start strictly in index order on every rank (collectives pair up by order), so a bucket waiting
// for a gradient this rank does not have (a parameter this micro-batch did not use) holds the
// later ones until finish().
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "train/parallel.h"

namespace mf {

class GradOverlap {
 public:
  static constexpr int64_t kBucketBytes = 4 << 20;
  GradOverlap(DataParallel& group, std::vector<at::Tensor> params, int64_t bucket_bytes = kBucketBytes);
  ~GradOverlap();  // removes the hooks
  GradOverlap(const GradOverlap&) = delete;
  GradOverlap& operator=(const GradOverlap&) = delete;

  void arm();  // the next backward is this rank's last of the step: its gradients start the sums
  // After that backward: starts what is left, waits for every sum and stores it as each
  // parameter's gradient (a parameter without one gets the sum too). Returns [P] float32:
  // 1 where this rank had a gradient of its own, 0 where it did not.
  at::Tensor finish();

  size_t buckets() const { return buckets_.size(); }
  size_t started_in_backward() const { return started_in_backward_; }  // of the last step

 private:
  struct Bucket {
    std::vector<size_t> params;
    at::Tensor flat;                // the bucket's gradients side by side, summed in place
    std::vector<at::Tensor> slots;  // a view of `flat` per parameter
    size_t waiting = 0;             // gradients yet to arrive this step
  };
  void arrived(size_t param, const at::Tensor& grad);
  void start_ready();

  DataParallel& group_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, slot)
  std::vector<bool> filled_;                      // param: its slot holds this step's gradient
  std::vector<unsigned> hooks_;
  size_t next_ = 0;  // the next bucket to start
  size_t started_in_backward_ = 0;
  bool armed_ = false;
};

}  // namespace mf
