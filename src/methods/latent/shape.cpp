#include "methods/latent/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "methods/latent/latent.h"

namespace mf {

LatentCost latent_cost(int64_t d, const MoELayerShape& s) {
  const double l = static_cast<double>(s.latent > 0 ? s.latent : d), m = static_cast<double>(s.expert_hidden);
  LatentCost c;
  c.P = static_cast<double>(s.num_experts) * l * m;
  c.C = static_cast<double>(s.top_k) * l * m;
  c.V = static_cast<double>(s.top_k) * l;
  c.Q = (s.latent > 0 ? 2 * l : 0) + static_cast<double>(s.num_experts) + 3.0 * static_cast<double>(s.shared_hidden);
  c.params = 3 * c.P + static_cast<double>(d) * c.Q;
  c.macs = 3 * c.C + static_cast<double>(d) * c.Q;
  return c;
}

std::vector<std::pair<int64_t, int64_t>> near_square_shapes(int64_t budget, int64_t multiple, double max_dev) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t l = multiple; l <= budget; l += multiple)
    if (budget % l == 0 && (budget / l) % multiple == 0) {
      const double aspect = static_cast<double>(l) / static_cast<double>(budget / l);
      if (std::abs(aspect - 1) <= max_dev) out.emplace_back(l, budget / l);
    }
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) {
    auto dev = [](auto& p) { return std::abs(std::log(static_cast<double>(p.first) / static_cast<double>(p.second))); };
    return dev(a) < dev(b);
  });
  return out;
}

MoELayerShape scale_for_accuracy(int64_t d, const MoELayerShape& s, int64_t alpha) {
  if (alpha < 1 || d % alpha != 0)
    throw std::invalid_argument(fmt::format("compression {} must divide d = {}", alpha, d));
  MoELayerShape o = s;
  o.latent = d / alpha;
  o.num_experts = s.num_experts * alpha;
  o.top_k = s.top_k * alpha;
  o.vanilla_experts = o.num_experts;
  return o;
}

static int64_t round_to(double v, int64_t multiple, int64_t at_least) {
  return std::max(at_least, static_cast<int64_t>(std::llround(v / static_cast<double>(multiple))) * multiple);
}

SolvedShape solve_constant_cost(int64_t d, const MoELayerShape& ref, int64_t latent, int64_t multiple) {
  if (latent < 1 || latent >= d)
    throw std::invalid_argument(fmt::format("latent width {} must be in [1, d = {})", latent, d));
  SolvedShape s;
  s.target = latent_cost(d, ref);
  const double l = static_cast<double>(latent);
  s.m = s.target.C / s.target.V;
  s.K = s.target.V / l;
  s.N = s.K * s.target.P / s.target.C;
  s.ms = (s.target.Q - 2 * l - s.N) / 3;
  // the exact (fractional) layer meets every target by construction
  s.exact.P = s.N * l * s.m;
  s.exact.C = s.K * l * s.m;
  s.exact.V = s.K * l;
  s.exact.Q = 2 * l + s.N + 3 * s.ms;
  s.exact.params = 3 * s.exact.P + static_cast<double>(d) * s.exact.Q;
  s.exact.macs = 3 * s.exact.C + static_cast<double>(d) * s.exact.Q;
  // round one quantity at a time and re-solve the rest, so later choices absorb earlier errors
  // (m may move off C*/V*: the expert's aspect ratio gives way before the matched costs do)
  auto& r = s.rounded;
  r.latent = latent;
  r.top_k = std::max<int64_t>(1, std::llround(s.K));
  r.expert_hidden = round_to(s.target.C / (static_cast<double>(r.top_k) * l), multiple, multiple);
  r.num_experts =
      std::max(r.top_k, static_cast<int64_t>(std::llround(s.target.P / (l * static_cast<double>(r.expert_hidden)))));
  const double ms = (s.target.Q - 2 * l - static_cast<double>(r.num_experts)) / 3;
  r.shared_hidden = ms > 0 ? round_to(ms, multiple, 0) : 0;
  r.vanilla_experts = r.num_experts;
  s.achieved = latent_cost(d, r);
  return s;
}

double SolvedShape::max_abs_deviation() const {
  double worst = 0;
  for (auto [a, t] :
       {std::pair{achieved.P, target.P}, {achieved.C, target.C}, {achieved.V, target.V}, {achieved.Q, target.Q}})
    worst = std::max(worst, std::abs(a / t - 1));
  return worst;
}

std::string SolvedShape::deviations() const {
  auto pct = [](double a, double t) { return 100 * (a / t - 1); };
  return fmt::format("P {:+.2f}% C {:+.2f}% V {:+.2f}% Q {:+.2f}%", pct(achieved.P, target.P),
                     pct(achieved.C, target.C), pct(achieved.V, target.V), pct(achieved.Q, target.Q));
}

TwoSegment two_segment(const Config& base, int64_t split, const MoELayerShape& reference, int64_t narrow, int64_t wide,
                       int64_t multiple) {
  const int64_t d = base.model.d_model;
  TwoSegment t{base, solve_constant_cost(d, reference, narrow, multiple),
               solve_constant_cost(d, reference, wide, multiple)};
  std::vector<MoELayerShape> shapes;
  for (int64_t b = 0; b < base.model.n_layers; ++b)
    if (is_moe_layer(base.model, b)) shapes.push_back(b < split ? t.narrow.rounded : t.wide.rounded);
  t.config.model.moe.section<LatentConfig>().shapes = format_latent_shapes(shapes);
  return t;
}

std::string TwoSegment::shapes() const { return config.model.moe.section<LatentConfig>().shapes; }

std::string TwoSegment::summary() const {
  return fmt::format("model.moe.latent.shapes = \"{}\"\n  narrow: {}\n  wide:   {}\n", shapes(), narrow.deviations(),
                     wide.deviations());
}

}  // namespace mf
