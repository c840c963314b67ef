#include "train/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <sstream>

namespace mf {
namespace {

template <class K>
K make_key(c10::TensorImpl* p) {
  if constexpr (std::is_same_v<K, std::string>) {
    std::ostringstream s;
    s << p;
    return s.str();
  } else {
    return static_cast<K>(p);
  }
}

struct Coefficients {
  double decay, beta1, beta2, bias2_sqrt, eps, step_size;
};

// Scalars are rounded to the tensor's type once, as ATen does for a scalar operand; the
// operation order per element is LibTorch's.
template <typename T>
void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, const Coefficients& c) {
  const T decay = static_cast<T>(c.decay), b1 = static_cast<T>(c.beta1), b2 = static_cast<T>(c.beta2);
  const T one_b1 = static_cast<T>(1 - c.beta1), one_b2 = static_cast<T>(1 - c.beta2);
  const T bias2_sqrt = static_cast<T>(c.bias2_sqrt), eps = static_cast<T>(c.eps), step = static_cast<T>(-c.step_size);
  at::parallel_for(0, n, 1 << 14, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T gi = g[i];
      const T mi = m[i] * b1 + one_b1 * gi;
      const T vi = v[i] * b2 + one_b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay + step * mi / (std::sqrt(vi) / bias2_sqrt + eps);
    }
  });
}

bool fusable(const torch::Tensor& p, const torch::Tensor& g) {
  return p.is_cpu() && g.is_cpu() && p.is_contiguous() && g.is_contiguous() && p.scalar_type() == g.scalar_type() &&
         (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble);
}

}  // namespace

OptimizerStateKey optimizer_state_key(const torch::Tensor& p) {
  return make_key<OptimizerStateKey>(p.unsafeGetTensorImpl());
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  for (auto& group : param_groups())
    for (auto& p : group.params())
      if (p.grad().defined() &&
          (!fusable(p, p.grad()) || static_cast<torch::optim::AdamWOptions&>(group.options()).amsgrad()))
        return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_mode(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state()[optimizer_state_key(p)];
      if (!slot) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      const auto t = static_cast<double>(s.step());
      const auto [beta1, beta2] = o.betas();
      const Coefficients c{1 - o.lr() * o.weight_decay(),     beta1,   beta2,
                           std::sqrt(1 - std::pow(beta2, t)), o.eps(), o.lr() / (1 - std::pow(beta1, t))};
      auto& m = s.exp_avg();
      auto& v = s.exp_avg_sq();
      AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "fused_adamw", [&] {
        adamw_kernel<scalar_t>(p.data_ptr<scalar_t>(), p.grad().data_ptr<scalar_t>(), m.data_ptr<scalar_t>(),
                               v.data_ptr<scalar_t>(), p.numel(), c);
      });
      p.unsafeGetTensorImpl()->bump_version();  // written through its pointer: caches keyed on the version see it
    }
  }
  return loss;
}

}  // namespace mf
