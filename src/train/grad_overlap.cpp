#include "train/grad_overlap.h"

#include <ATen/core/grad_mode.h>

namespace mf {

GradOverlap::GradOverlap(DataParallel& group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(group), params_(std::move(params)), where_(params_.size()), filled_(params_.size(), false) {
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {  // reverse registration order
    const auto& p = params_[k];
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fresh = buckets_.empty() || bytes + size > bucket_bytes ||
                       params_[buckets_.back().params.front()].scalar_type() != p.scalar_type();
    if (fresh) buckets_.emplace_back(), bytes = 0;
    where_[k] = {buckets_.size() - 1, buckets_.back().params.size()};
    buckets_.back().params.push_back(k);
    bytes += size;
  }
  for (auto& b : buckets_) {
    int64_t n = 0;
    for (auto k : b.params) n += params_[k].numel();
    b.flat = at::zeros({n}, params_[b.params.front()].options());
    int64_t at = 0;
    for (auto k : b.params) {
      b.slots.push_back(b.flat.narrow(0, at, params_[k].numel()).view(params_[k].sizes()));
      at += params_[k].numel();
    }
  }
  for (size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(params_[k].register_hook([this, k](const at::Tensor& grad) { arrived(k, grad); }));
}

GradOverlap::~GradOverlap() {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

void GradOverlap::arm() {
  armed_ = true;
  next_ = 0;
  started_in_backward_ = 0;
  std::fill(filled_.begin(), filled_.end(), false);
  for (auto& b : buckets_) b.waiting = b.params.size();
}

// The hook runs before the gradient is added to .grad, which holds this rank's earlier
// micro-batches of the step: the slot gets both.
void GradOverlap::arrived(size_t k, const at::Tensor& grad) {
  if (!armed_) return;
  at::NoGradGuard no_grad;
  auto [b, s] = where_[k];
  auto& slot = buckets_[b].slots[s];
  slot.copy_(grad);
  if (params_[k].grad().defined()) slot.add_(params_[k].grad());
  filled_[k] = true;
  --buckets_[b].waiting;
  start_ready();
  started_in_backward_ = next_;
}

void GradOverlap::start_ready() {
  while (next_ < buckets_.size() && buckets_[next_].waiting == 0) group_.start_sum({buckets_[next_++].flat});
}

at::Tensor GradOverlap::finish() {
  at::NoGradGuard no_grad;
  auto had = at::zeros({static_cast<int64_t>(params_.size())}, at::kFloat);
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& g = params_[k].grad();
    had.data_ptr<float>()[k] = g.defined() ? 1.0f : 0.0f;
    if (filled_[k]) continue;
    auto [b, s] = where_[k];
    auto& slot = buckets_[b].slots[s];
    if (g.defined())
      slot.copy_(g);
    else
      slot.zero_();
    --buckets_[b].waiting;
  }
  start_ready();
  group_.finish_sums();
  for (size_t k = 0; k < params_.size(); ++k) {
    auto [b, s] = where_[k];
    auto& g = params_[k].mutable_grad();
    if (g.defined())
      g.copy_(buckets_[b].slots[s]);
    else
      g = buckets_[b].slots[s].clone();  // the bucket is reused next step
  }
  armed_ = false;
  return had;
}

}  // namespace mf
