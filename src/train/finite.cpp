#include "train/finite.h"

#include <torch/torch.h>

namespace mf {

std::string first_nonfinite(const NamedTensors& tensors) {
  std::vector<at::Tensor> finite;
  std::vector<size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i].second;
    if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type())) continue;
    finite.push_back(torch::isfinite(t).all());
    index.push_back(i);
  }
  if (finite.empty()) return "";
  const auto all = torch::stack(finite).cpu();
  if (all.all().item<bool>()) return "";
  const auto* ok = all.data_ptr<bool>();
  for (size_t k = 0; k < index.size(); ++k)
    if (!ok[k]) return tensors[index[k]].first;
  return "";
}

NamedTensors gradients(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) out.emplace_back("gradient of " + name, p.grad());
  return out;
}

}  // namespace mf
