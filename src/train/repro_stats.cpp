#include "train/repro_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "core/util.h"
#include "train/metrics.h"

namespace mf {
namespace {

// I_x(a, b), the regularized incomplete beta function, by its continued fraction
//   I_x(a, b) = x^a (1-x)^b / (a B(a, b)) * 1 / (1 + d1 / (1 + d2 / (1 + ...)))
//   d_{2k+1} = -(a+k)(a+b+k) x / ((a+2k)(a+2k+1)),  d_{2k} = k(b-k) x / ((a+2k-1)(a+2k)),
// evaluated with the modified Lentz method; it converges fast for x < (a+1)/(a+b+2), and the
// symmetry I_x(a, b) = 1 - I_{1-x}(b, a) covers the rest.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);
  const double front =
      std::exp(a * std::log(x) + b * std::log1p(-x) - std::lgamma(a) - std::lgamma(b) + std::lgamma(a + b)) / a;
  const double tiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const int k = i / 2;
    double num;
    if (i == 0)
      num = 1;
    else if (i % 2 == 0)
      num = k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k));
    else
      num = -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1));
    d = 1 + num * d;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    c = 1 + num / (std::abs(c) < tiny ? tiny : c);
    f *= c * d;
    if (std::abs(1 - c * d) < 1e-15) return front * (f - 1);
  }
  return front * (f - 1);
}

}  // namespace

double student_t_cdf(double t, int64_t dof) {
  if (dof < 1) throw std::invalid_argument("student_t_cdf: dof must be >= 1");
  const double v = static_cast<double>(dof);
  // P(|T| > |t|) = I_{v / (v + t^2)}(v/2, 1/2)
  const double tail = 0.5 * incomplete_beta(v / 2, 0.5, v / (v + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, int64_t dof) {
  if (!(p > 0 && p < 1)) throw std::invalid_argument("student_t_quantile: p must lie in (0, 1)");
  if (p < 0.5) return -student_t_quantile(1 - p, dof);
  double lo = 0, hi = 1;
  while (student_t_cdf(hi, dof) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-13 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, dof) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double PairedDifference::half_width() const {
  if (degrees() < 1) return NAN;
  return student_t_quantile(0.975, degrees()) * se;
}

std::string PairedDifference::call(bool want_positive) const {
  if (degrees() < 1) return "not resolved (one seed)";
  const double w = half_width();
  const double signed_mean = want_positive ? mean : -mean;
  if (signed_mean - w > 0) return "held";
  if (signed_mean + w < 0) return "did not hold";
  return "not resolved at this scale";
}

PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  PairedDifference d;
  d.seeds = n;
  if (n == 0) return d;
  std::vector<double> diff;
  for (size_t i = 0; i < n; ++i) diff.push_back(a[i] - b[i]);
  d.mean = std::accumulate(diff.begin(), diff.end(), 0.0) / static_cast<double>(n);
  if (n < 2) return d;
  double ss = 0;
  for (double x : diff) ss += (x - d.mean) * (x - d.mean);
  d.se = std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
  return d;
}

PairedDifference paired_from(double mean, double se, size_t seeds, int64_t dof) { return {mean, se, seeds, dof}; }

std::vector<double> seed_values(const nlohmann::json& arm, const std::string& key) {
  return arm.value(key, nlohmann::json::array()).get<std::vector<double>>();
}

nlohmann::json direction_json(const Direction& d, const PairedDifference& p) {
  nlohmann::json j = {{"text", d.text},       {"want_positive", d.want_positive},
                      {"primary", d.primary}, {"difference", d.scale * p.mean},
                      {"se", d.scale * p.se}, {"seeds", p.seeds},
                      {"unit", d.unit},       {"digits", d.digits}};
  if (p.degrees() >= 1) {
    j["dof"] = p.degrees();
    j["ci"] = {d.scale * p.lo(), d.scale * p.hi()};
    j["detectable"] = d.scale * p.half_width();
  }
  j["call"] = p.call(d.want_positive);
  if (d.paper) j["paper"] = {{"value", d.paper->value}, {"where", d.paper->where}};
  return j;
}

namespace {

PairedDifference stored_difference(const nlohmann::json& d) {
  return paired_from(d["difference"].get<double>(), d["se"].get<double>(), d["seeds"].get<size_t>(),
                     d.value("dof", int64_t{0}));
}

// " → **held**", or no verdict and why (see direction_line).
std::string verdict(const nlohmann::json& d, const std::string& withheld, bool still_falling) {
  if (!withheld.empty()) return fmt::format(" → **no verdict** ({})", withheld);
  const bool want = d.value("want_positive", true);
  const auto call = stored_difference(d).call(want);
  if (!still_falling || (call != "held" && call != "did not hold")) return fmt::format(" → **{}**", call);
  if (!d.contains("early"))
    return " → **no verdict** (runs still falling at the end, and no value at 80 % of the steps to check against)";
  const auto early = stored_difference(d["early"]).call(want);
  if (early != call)
    return fmt::format(" → **no verdict** ({} at the end but {} at 80 % of the steps, while runs were still falling)",
                       call, early);
  return fmt::format(" → **{}** (already at 80 % of the steps)", call);
}

}  // namespace

std::string shown_call(const nlohmann::json& d, bool withheld, bool still_falling) {
  if (withheld) return "no verdict";
  const bool want = d.value("want_positive", true);
  const auto call = stored_difference(d).call(want);
  if (!still_falling || (call != "held" && call != "did not hold")) return call;
  return d.contains("early") && stored_difference(d["early"]).call(want) == call ? call : "no verdict";
}

std::string direction_line(const nlohmann::json& d, const std::string& withheld, bool still_falling) {
  const int digits = d.value("digits", 4);
  const auto unit = d.value("unit", std::string());
  auto num = [&](double v) { return fmt::format("{:+.{}f}", v, digits); };
  auto interval = [&](const PairedDifference& p) {
    return fmt::format("95 % CI {} to {}, n = {}{}", num(p.lo()), num(p.hi()), p.seeds,
                       p.degrees() + 1 == static_cast<int64_t>(p.seeds) ? "" : fmt::format(", {} dof", p.degrees()));
  };
  const auto p = stored_difference(d);
  std::string s = fmt::format("- {}{}: {}{}", d.value("primary", false) ? "**[primary]** " : "",
                              d["text"].get<std::string>(), num(p.mean), unit);
  if (p.degrees() >= 1)
    s += fmt::format(" ({}; detectable at this n: ±{:.{}f})", interval(p), p.half_width(), digits);
  else
    s += fmt::format(" (n = {})", p.seeds);
  if (d.contains("early") && p.degrees() >= 1) {
    const auto e = stored_difference(d["early"]);
    s += fmt::format("; at 80 % of the steps: {} ({})", num(e.mean), interval(e));
  }
  if (d.contains("paper"))
    s += fmt::format("; paper: {}{} ({})", num(d["paper"]["value"].get<double>()), unit,
                     d["paper"]["where"].get<std::string>());
  return s + verdict(d, withheld, still_falling) + "\n";
}

double LeastSquares::half_width(size_t i) const { return dof >= 1 ? student_t_quantile(0.975, dof) * se.at(i) : NAN; }

LeastSquares least_squares(const std::vector<std::vector<double>>& X, const std::vector<double>& y) {
  const size_t n = X.size(), p = n ? X[0].size() : 0;
  if (n != y.size() || n <= p) throw std::invalid_argument("least_squares: need more observations than coefficients");
  // normal equations A = X'X, inverted by Gauss-Jordan with partial pivoting
  std::vector<std::vector<double>> A(p, std::vector<double>(2 * p, 0));
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j)
      for (size_t r = 0; r < n; ++r) A[i][j] += X[r][i] * X[r][j];
    A[i][p + i] = 1;
  }
  for (size_t c = 0; c < p; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < p; ++r)
      if (std::abs(A[r][c]) > std::abs(A[piv][c])) piv = r;
    if (std::abs(A[piv][c]) < 1e-12) throw std::invalid_argument("least_squares: the regressors are collinear");
    std::swap(A[c], A[piv]);
    const double inv = 1 / A[c][c];
    for (auto& v : A[c]) v *= inv;
    for (size_t r = 0; r < p; ++r)
      if (r != c) {
        const double f = A[r][c];
        for (size_t k = 0; k < 2 * p; ++k) A[r][k] -= f * A[c][k];
      }
  }
  LeastSquares fit;
  fit.coef.assign(p, 0);
  for (size_t i = 0; i < p; ++i)
    for (size_t j = 0; j < p; ++j)
      for (size_t r = 0; r < n; ++r) fit.coef[i] += A[i][p + j] * X[r][j] * y[r];
  double rss = 0;
  for (size_t r = 0; r < n; ++r) {
    double e = y[r];
    for (size_t i = 0; i < p; ++i) e -= X[r][i] * fit.coef[i];
    rss += e * e;
  }
  fit.dof = static_cast<int64_t>(n - p);
  const double s2 = rss / static_cast<double>(fit.dof);
  for (size_t i = 0; i < p; ++i) fit.se.push_back(std::sqrt(s2 * A[i][p + i]));
  return fit;
}

TrainingHealth training_health(const std::string& run_dir, double margin, double max_fall) {
  const auto summary = nlohmann::json::parse(read_file(run_dir + "/summary.json"));
  TrainingHealth h;
  h.val_loss = summary.value("val_loss_mean", NAN);
  h.unigram = summary.value("unigram_entropy_nats", 0.0);
  const double steps = summary.value("steps", 0.0);
  // the held-out loss where the run evaluated at least 3 times in its last 20 % (one batch's
  // training loss is noisy: its slope over a few logged steps swings by several %), else the
  // logged training losses
  std::vector<double> x, y;
  const auto records = read_metrics(run_dir + "/metrics.jsonl");
  std::string key;
  for (const std::string k : {"val_loss_mean", "loss"}) {
    key = k;
    x.clear(), y.clear();
    for (const auto& r : records)
      if (r.contains(key) && r.contains("step") && r["step"].get<double>() >= 0.8 * steps) {
        x.push_back(r["step"].get<double>());
        y.push_back(r[key].get<double>());
      }
    if (x.size() >= 3) break;
  }
  if (x.size() >= 3) {
    std::vector<std::vector<double>> X;
    for (double s : x) X.push_back({1, s});
    const double mean = std::accumulate(y.begin(), y.end(), 0.0) / static_cast<double>(y.size());
    h.late_fall = -least_squares(X, y).coef[1] * 0.2 * steps / mean;
  }
  const auto name = run_dir.substr(run_dir.find_last_of('/') + 1);
  if (h.unigram > 0 && h.val_loss > h.unigram - margin)
    h.kind = "plateau",
    h.problem = fmt::format("{} ends at {:.3f} nats, less than {:.1f} below the unigram entropy {:.3f}", name,
                            h.val_loss, margin, h.unigram);
  else if (x.size() < 3)
    h.kind = "few_losses",
    h.problem = fmt::format("{} logged fewer than 3 training losses in its last 20 % of steps", name);
  else if (h.late_fall > max_fall)
    h.kind = "falling",
    h.problem = fmt::format("{}'s {} loss still fell {:.1f} % over its last 20 % of steps (limit {:.0f} %)", name,
                            key == "loss" ? "training" : "held-out", 100 * h.late_fall, 100 * max_fall);
  return h;
}

double held_out_loss_at(const std::string& run_dir, double fraction) {
  const double steps = nlohmann::json::parse(read_file(run_dir + "/summary.json")).value("steps", 0.0);
  double loss = NAN;
  for (const auto& r : read_metrics(run_dir + "/metrics.jsonl"))
    if (r.contains("val_loss_mean") && r.contains("step") && r["step"].get<double>() <= fraction * steps + 1e-9)
      loss = r["val_loss_mean"].get<double>();
  return loss;
}

}  // namespace mf
