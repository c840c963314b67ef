// The fast path against its reference, as tests/moe compares them: run `forward` on a fresh
// leaf copy of x, back-propagate a non-trivial upstream gradient (dL/dy = d/dy sum y cos(3y + 1)
// with the cosine's argument held constant), and collect the output, x's gradient and whatever
// gradients `grads` reads afterwards; then compare every entry.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace mf::test {

inline std::vector<at::Tensor> output_and_grads(const std::function<at::Tensor(const at::Tensor& x)>& forward,
                                                const at::Tensor& x_in,
                                                const std::function<std::vector<at::Tensor>()>& grads) {
  auto x = x_in.detach().clone().requires_grad_(true);
  auto y = forward(x);
  (y * torch::cos(y.detach() * 3 + 1)).sum().backward();
  std::vector<at::Tensor> out{y.detach(), x.grad()};
  for (auto& g : grads()) out.push_back(g.defined() ? g.clone() : g);
  return out;
}

// Every pair within rtol / atol (float64 by default); `names` label the entries in failures.
inline void expect_close(const std::vector<at::Tensor>& fast, const std::vector<at::Tensor>& ref,
                         const std::vector<std::string>& names, const std::string& what, double rtol = 1e-10,
                         double atol = 1e-12) {
  ASSERT_EQ(fast.size(), ref.size()) << what;
  for (size_t i = 0; i < fast.size(); ++i) {
    const std::string name = i < names.size() ? names[i] : std::to_string(i);
    ASSERT_EQ(fast[i].defined(), ref[i].defined()) << what << ": " << name;
    if (!fast[i].defined()) continue;
    EXPECT_TRUE(torch::allclose(fast[i], ref[i], rtol, atol))
        << what << ": " << name << " max diff " << (fast[i] - ref[i]).abs().max().item<double>();
  }
}

}  // namespace mf::test
