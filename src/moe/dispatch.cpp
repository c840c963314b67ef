#include "moe/dispatch.h"

#include <torch/torch.h>

#include <cmath>

namespace mf {

DispatchResult dispatch(const at::Tensor& x, const Assignment& a, UnitBank& bank, const DispatchOptions& opt) {
  const int64_t E = bank.num_units();
  auto order = std::get<1>(a.unit.sort(/*stable=*/true, 0, /*descending=*/false));  // ties keep token order
  auto unit = a.unit.index_select(0, order), token = a.token.index_select(0, order);
  auto weight = a.weight.index_select(0, order);
  DispatchResult r;
  if (opt.capacity_factor > 0) {  // keep the first `cap` pairs of each unit (token order)
    const auto cap = static_cast<int64_t>(std::ceil(opt.capacity_factor * static_cast<double>(a.unit.numel()) / E));
    auto starts = at::bincount(unit, {}, E).cumsum(0) - at::bincount(unit, {}, E);
    auto rank = torch::arange(unit.numel(), torch::kLong) - starts.index_select(0, unit);
    auto keep = (rank < cap).nonzero().squeeze(1);
    r.dropped = unit.numel() - keep.numel();
    unit = unit.index_select(0, keep), token = token.index_select(0, keep), weight = weight.index_select(0, keep);
  }
  auto counts_t = at::bincount(unit, {}, E);
  std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + E);
  auto rows = x.index_select(0, token);
  auto out = bank.forward_grouped(rows, counts) * weight.to(x.dtype()).unsqueeze(1);
  r.output = torch::zeros_like(x).index_add(0, token, out);
  return r;
}

at::Tensor dense_reference(const at::Tensor& x, const Assignment& a, UnitBank& bank) {
  const int64_t T = x.size(0), E = bank.num_units();
  auto W = torch::zeros({T * E}, x.options()).index_add(0, a.token * E + a.unit, a.weight.to(x.dtype())).view({T, E});
  auto y = torch::zeros_like(x);
  for (int64_t e = 0; e < E; ++e) y = y + W.select(1, e).unsqueeze(1) * bank.forward_unit(e, x);
  return y;
}

}  // namespace mf
