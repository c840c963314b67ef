#include "methods/unipool/pool_balance.h"

#include <torch/torch.h>

namespace mf {

PoolBalanceImpl::PoolBalanceImpl(int64_t pool_size, int64_t num_layers, double alpha)
    : pool_size_(pool_size), num_layers_(num_layers), alpha_(alpha) {
  fraction = register_buffer("fraction", torch::zeros({pool_size}));
  ready = register_buffer("ready", torch::zeros({}));
}

at::Tensor PoolBalanceImpl::layer_loss(const at::Tensor& scores_TE, const at::Tensor& unit_P, bool record) {
  // a copy: the last layer of the pool refreshes `fraction` in place before backward runs
  auto fbar_E = fraction.to(scores_TE.dtype(), /*non_blocking=*/false, /*copy=*/true);
  auto loss = pool_aux_loss(fbar_E, scores_TE.mean(0), alpha_);
  if (record) {
    torch::NoGradGuard g;
    const double pairs = static_cast<double>(std::max<int64_t>(1, unit_P.numel()));
    auto share_E = at::bincount(unit_P, {}, pool_size_).to(torch::kDouble) / pairs;
    current_sum_E_ = current_sum_E_.defined() ? current_sum_E_ + share_E : share_E;
    if (++reported_ == num_layers_) {
      fraction.copy_(current_sum_E_ / static_cast<double>(num_layers_));
      ready.fill_(1.0);
      current_sum_E_ = at::Tensor();
      reported_ = 0;
    }
  }
  return loss;
}

at::Tensor pool_aux_loss(const at::Tensor& fbar_E, const at::Tensor& pbar_E, double alpha) {
  return alpha * static_cast<double>(fbar_E.numel()) * (fbar_E * pbar_E).sum();
}

}  // namespace mf
