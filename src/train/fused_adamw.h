// AdamW whose update is one pass over each parameter (LibTorch's C++ AdamW makes about ten:
// mul_, add_, addcmul_, sqrt, div, add_, addcdiv_, each reading and writing whole tensors).
// Same math, same state objects (AdamWParamState: exp_avg, exp_avg_sq, step), so checkpoints
// and optimizer_state_tensors() are unchanged. Per element, with t the parameter's step count:
//   p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// amsgrad, non-CPU or non-contiguous tensors take LibTorch's own step.
#pragma once
#include <torch/optim/adamw.h>

#include <type_traits>

namespace mf {

// The key of parameter p in Optimizer::state(): LibTorch 1.13 uses the TensorImpl address
// printed as a string, 2.x the pointer itself (the type is taken from the map, so both compile).
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey optimizer_state_key(const torch::Tensor& p);

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace mf
