#include "methods/umoe/specialisation.h"

#include <cmath>
#include <numeric>
#include <stdexcept>

namespace mf {
namespace {

std::vector<double> normalised(const std::vector<double>& v) {
  const double total = std::accumulate(v.begin(), v.end(), 0.0);
  if (!(total > 0)) throw std::invalid_argument("js_divergence: a distribution with no mass");
  std::vector<double> out;
  for (double x : v) out.push_back(x / total);
  return out;
}

// sum_i a_i log2(a_i / b_i), terms with a_i = 0 dropped
double kl_bits(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] > 0) s += a[i] * std::log2(a[i] / b[i]);
  return s;
}

}  // namespace

double js_divergence(const std::vector<double>& p, const std::vector<double>& q) {
  if (p.size() != q.size()) throw std::invalid_argument("js_divergence: distributions of different lengths");
  const auto a = normalised(p), b = normalised(q);
  std::vector<double> m;
  for (size_t i = 0; i < a.size(); ++i) m.push_back(0.5 * (a[i] + b[i]));
  return 0.5 * kl_bits(a, m) + 0.5 * kl_bits(b, m);
}

std::vector<double> domain_divergence(const std::vector<std::vector<std::vector<double>>>& counts) {
  if (counts.size() < 2) throw std::invalid_argument("domain_divergence: needs at least two domains");
  std::vector<double> out;
  for (size_t l = 0; l < counts[0].size(); ++l) {
    double sum = 0;
    int pairs = 0;
    for (size_t i = 0; i < counts.size(); ++i)
      for (size_t j = i + 1; j < counts.size(); ++j, ++pairs) sum += js_divergence(counts[i].at(l), counts[j].at(l));
    out.push_back(sum / pairs);
  }
  return out;
}

}  // namespace mf
