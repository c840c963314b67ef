#include "moe/dispatch.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>

#include "moe/combine.h"
#include "moe/fused_units.h"
#include "moe/select_rows.h"

namespace mf {

namespace {

// rows of x for pairs already sorted by unit (counts_E of each) -> the units' outputs (the per-token
// side input gathered alike)
at::Tensor grouped_units(const at::Tensor& x_TD, const at::Tensor& token_P, const at::Tensor& counts_E,
                         UnitBank& bank) {
  auto rows_PD = gather_rows(x_TD, token_P);
  const auto side_TS = bank.per_token(x_TD);
  return side_TS.defined() ? bank.forward_grouped(rows_PD, counts_E, gather_rows(side_TS, token_P))
                           : bank.forward_grouped(rows_PD, counts_E);
}

// a stable sort of the pairs by unit (ties keep token order), or none if they come sorted
at::Tensor sorted_order(const Assignment& a, int64_t units) {
  if (a.sorted_by_unit) return at::arange(a.unit_P.numel(), a.unit_P.options());
  return unit_order(a.unit_P, units);
}

std::atomic<int> forced_path{-1};

}  // namespace

const char* to_string(UnitsPath path) {
  switch (path) {
    case UnitsPath::Grouped: return "grouped";
    case UnitsPath::Combined: return "combined";
    case UnitsPath::Fused: return "fused";
  }
  return "?";
}

void force_units_path(std::optional<UnitsPath> path) { forced_path = path ? static_cast<int>(*path) : -1; }

UnitsPath units_path(const at::Tensor& x_TD, const UnitBank& bank, int64_t pairs) {
  const bool combined = bank.offers_combined();
  const bool fused = combined && !at::GradMode::is_enabled() && bank.unit_pack() && fused_units_available(x_TD);
  if (const int f = forced_path; f >= 0) {
    const auto path = static_cast<UnitsPath>(f);
    TORCH_CHECK(path == UnitsPath::Grouped || combined, "units path '", to_string(path),
                "' is pinned but this bank computes only grouped units");
    TORCH_CHECK(path != UnitsPath::Fused || fused,
                "units path 'fused' is pinned but needs no grad mode, float32 on the CPU and packed weights");
    return path;
  }
  return fused && fused_units_preferred(x_TD, pairs, bank.num_units()) ? UnitsPath::Fused
         : combined                                                    ? UnitsPath::Combined
                                                                       : UnitsPath::Grouped;
}

PairOutputs pair_outputs(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank) {
  PairOutputs p;
  p.order_P = sorted_order(a, bank.num_units());
  p.unit_P = a.unit_P.index_select(0, p.order_P);
  p.out_PD =
      grouped_units(x_TD, a.token_P.index_select(0, p.order_P), at::bincount(p.unit_P, {}, bank.num_units()), bank);
  return p;
}

DispatchResult dispatch(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank, const DispatchOptions& opt) {
  const int64_t E = bank.num_units();
  auto unit_P = a.unit_P, token_P = a.token_P, weight_P = a.weight_P;
  if (!a.sorted_by_unit) {
    auto order_P = sorted_order(a, E);
    unit_P = unit_P.index_select(0, order_P);
    token_P = token_P.index_select(0, order_P);
    weight_P = weight_P.index_select(0, order_P);
  }
  DispatchResult r;
  r.dropped = torch::zeros({}, unit_P.options());
  if (opt.capacity_factor > 0) {  // keep the first `cap` pairs of each unit (token order)
    const auto cap = static_cast<int64_t>(std::ceil(opt.capacity_factor * static_cast<double>(a.unit_P.numel()) / E));
    auto counts_E = at::bincount(unit_P, {}, E);
    auto starts_E = counts_E.cumsum(0) - counts_E;
    auto rank_P = torch::arange(unit_P.numel(), unit_P.options()) - starts_E.index_select(0, unit_P);
    auto keep = (rank_P < cap).nonzero().squeeze(1);
    r.dropped = r.dropped + (unit_P.numel() - keep.numel());
    unit_P = unit_P.index_select(0, keep);
    token_P = token_P.index_select(0, keep);
    weight_P = weight_P.index_select(0, keep);
  }
  const auto counts_E = at::bincount(unit_P, {}, E);
  const auto path = units_path(x_TD, bank, unit_P.numel());
  if (path != UnitsPath::Grouped) {
    r.y_TD = bank.forward_combined(x_TD, token_P, weight_P, counts_E, path == UnitsPath::Fused);
    return r;
  }
  r.y_TD = combine(grouped_units(x_TD, token_P, counts_E, bank), token_P, weight_P.to(x_TD.dtype()), x_TD.size(0));
  return r;
}

at::Tensor dense_reference(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank) {
  const int64_t T = x_TD.size(0), E = bank.num_units();
  auto w_TE = torch::zeros({T * E}, x_TD.options())
                  .index_add(0, a.token_P * E + a.unit_P, a.weight_P.to(x_TD.dtype()))
                  .view({T, E});
  auto y_TD = torch::zeros_like(x_TD);
  for (int64_t e = 0; e < E; ++e) y_TD = y_TD + w_TE.select(1, e).unsqueeze(1) * bank.forward_unit(e, x_TD);
  return y_TD;
}

}  // namespace mf
