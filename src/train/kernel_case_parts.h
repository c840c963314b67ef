// What the kernel case table's files (train/kernel_cases*.cpp) share: seeded inputs, a case's
// forward + backward, and the model's cases (attention, RMSNorm, rotary embeddings).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "train/kernel_cases.h"

namespace mf::cases {

using Outputs = std::vector<at::Tensor>;

// Seeded float64 values cast to the case's dtype: the float32 and float64 tables see the same inputs.
inline at::Tensor input(at::IntArrayRef shape, at::ScalarType dtype, bool grad = false) {
  auto t = torch::randn(shape, torch::kFloat64).to(dtype);
  return grad ? t.requires_grad_(true) : t;
}

// The output of f and the gradients of `leaves` under the upstream gradient `up`.
inline Outputs forward_backward(const std::function<at::Tensor()>& f, const std::vector<at::Tensor>& leaves,
                                const at::Tensor& up) {
  for (auto x : leaves) x.mutable_grad() = at::Tensor();
  auto y = f();
  y.backward(up);
  Outputs out{y.detach()};
  for (auto& x : leaves) out.push_back(x.grad().clone());
  return out;
}

// train/kernel_cases_model.cpp
std::vector<KernelCase> model_kernel_cases(CaseSize size, at::ScalarType dtype);

}  // namespace mf::cases
