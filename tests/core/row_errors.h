// Error measures of the row kernels' tests (core/bf16.h, core/q8.h).
#pragma once
#include <torch/torch.h>

namespace mf::test {

// max |a - b| / max |b|
inline double rel_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         b.to(at::kDouble).abs().max().item<double>();
}

// max |y - x w^T| over max (|x| |w|^T), the scale float32 sums of K products err on: at most about K u
// (u = 2^-24) in any summation order; w's values as they are (float64 math)
inline double sum_error(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w) {
  const auto x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  return (y.to(at::kDouble) - at::mm(x64, w64.t())).abs().max().item<double>() /
         at::mm(x64.abs(), w64.abs().t()).max().item<double>();
}

}  // namespace mf::test
