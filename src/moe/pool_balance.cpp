#include "moe/pool_balance.h"

#include <torch/torch.h>

namespace mf {

PoolBalanceImpl::PoolBalanceImpl(int64_t pool_size, int64_t num_layers, double alpha)
    : pool_size_(pool_size), num_layers_(num_layers), alpha_(alpha) {
  fraction = register_buffer("fraction", torch::zeros({pool_size}));
  ready_ = register_buffer("ready", torch::zeros({}));
  current_sum_ = torch::zeros({pool_size}, torch::kDouble);
}

at::Tensor PoolBalanceImpl::layer_loss(const at::Tensor& scores, const at::Tensor& unit, bool record) {
  at::Tensor loss;
  // a copy: the last layer of the pool refreshes `fraction` in place before backward runs
  if (ready()) loss = pool_aux_loss(fraction.to(scores.dtype(), /*non_blocking=*/false, /*copy=*/true), scores.mean(0), alpha_);
  if (record) {
    torch::NoGradGuard g;
    const double pairs = static_cast<double>(std::max<int64_t>(1, unit.numel()));
    current_sum_ += at::bincount(unit, {}, pool_size_).to(torch::kDouble) / pairs;
    if (++reported_ == num_layers_) {
      fraction.copy_(current_sum_ / static_cast<double>(num_layers_));
      ready_.fill_(1.0);
      current_sum_.zero_(), reported_ = 0;
    }
  }
  return loss;
}

at::Tensor pool_aux_loss(const at::Tensor& fbar, const at::Tensor& pbar, double alpha) {
  return alpha * static_cast<double>(fbar.numel()) * (fbar * pbar).sum();
}

}  // namespace mf
