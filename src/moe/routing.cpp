#include "moe/routing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mf {

int64_t RoutingStats::dead_units() const { return std::count(load.begin(), load.end(), int64_t{0}); }

double RoutingStats::max_over_mean() const {
  if (load.empty()) return 0;
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  return mean > 0 ? static_cast<double>(*std::max_element(load.begin(), load.end())) / mean : 0;
}

double RoutingStats::cv() const {
  if (load.empty()) return 0;
  const double n = static_cast<double>(load.size());
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / n;
  double var = 0;
  for (auto l : load) var += (l - mean) * (l - mean) / n;
  return mean > 0 ? std::sqrt(var) / mean : 0;
}

RoutingTally tally_routing(const RouterOutput& out) {
  const auto& a = out.assignment;
  RoutingTally t;
  t.load_E = at::bincount(a.unit_P, {}, a.num_units);
  t.pairs = a.unit_P.numel();
  t.tokens = a.num_tokens;
  t.dropped = at::zeros({}, a.unit_P.options());
  if (out.scores_TE.defined()) t.scores_TE = out.scores_TE.detach();
  for (auto& [name, v] : out.losses) t.losses.emplace_back(name, v.detach());
  for (auto& c : out.counts) t.counts.push_back({c.name, c.count_T.detach(), c.max});
  return t;
}

RoutingStats read_routing(const RoutingTally& t) {
  RoutingStats s;
  if (!t.load_E.defined()) return s;
  auto entropy = at::zeros({1}, t.load_E.options().dtype(at::kDouble));
  if (t.scores_TE.defined() && t.tokens > 0) {
    auto p_TE = t.scores_TE.to(at::kDouble);
    p_TE = p_TE / p_TE.sum(-1, true).clamp_min(1e-30);  // NormRouter scores are not a distribution
    entropy = (-(p_TE * p_TE.clamp_min(1e-30).log()).sum(-1)).mean().view({1});
  }
  std::vector<at::Tensor> parts = {t.load_E.to(at::kDouble), entropy, t.dropped.to(at::kDouble).view({1})};
  for (auto& [name, v] : t.losses) parts.push_back(v.to(at::kDouble).view({1}));
  for (auto& c : t.counts) parts.push_back(at::bincount(c.count_T.clamp(0, c.max), {}, c.max + 1).to(at::kDouble));
  auto flat = at::cat(parts).cpu().contiguous();  // the one device -> host copy
  const double* p = flat.data_ptr<double>();
  const int64_t E = t.load_E.numel();
  for (int64_t e = 0; e < E; ++e) s.load.push_back(static_cast<int64_t>(p[e]));
  s.entropy = p[E];
  s.dropped = static_cast<int64_t>(p[E + 1]);
  for (size_t i = 0; i < t.losses.size(); ++i) s.losses.emplace_back(t.losses[i].first, p[E + 2 + i]);
  int64_t at = E + 2 + static_cast<int64_t>(t.losses.size());
  for (auto& c : t.counts) {
    RoutingStats::Count out{c.name, 0, {}};
    double n = 0;
    for (int64_t v = 0; v <= c.max; ++v, ++at) {
      out.histogram.push_back(static_cast<int64_t>(p[at]));
      out.mean += static_cast<double>(v) * p[at];
      n += p[at];
    }
    out.mean = n > 0 ? out.mean / n : 0;
    s.counts.push_back(std::move(out));
  }
  s.mean_units_per_token = t.tokens ? static_cast<double>(t.pairs) / static_cast<double>(t.tokens) : 0;
  return s;
}

}  // namespace mf
