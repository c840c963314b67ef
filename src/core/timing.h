// Wall-clock timing for benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

namespace mf {

// seconds of one call of f()
template <class Fn>
double seconds(Fn f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// best-of-`iters` seconds of f() after one warm-up call
template <class Fn>
double best_seconds(int iters, Fn f) {
  f();
  double best = 1e30;
  for (int i = 0; i < iters; ++i) best = std::min(best, seconds(f));
  return best;
}

// Every fn timed in rounds: `warmup` untimed rounds, then `rounds` rounds that call each fn once,
// round r starting at fn r mod n so that none always runs first; seconds[i][r] of fn i in round r.
// A slow phase of a shared machine then hits every fn of a round alike (compare with median_ratio).
// `settle` untimed calls of a fn right before its timed one: passes that allocate differently
// leave glibc's heap with freed blocks the next one does not fit, and it faults in fresh pages
// (a dense layer after the MoE layer, E 256: 8-16 MB a pass), which a repeated pass does not.
inline std::vector<std::vector<double>> round_seconds(int rounds, const std::vector<std::function<void()>>& fns,
                                                      int warmup = 2, int settle = 0) {
  const size_t n = fns.size();
  std::vector<std::vector<double>> out(n);
  for (int r = -warmup; r < rounds; ++r)
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (static_cast<size_t>(std::max(r, 0)) + j) % n;
      for (int c = 0; c < settle && r >= 0; ++c) fns[i]();
      const double s = seconds(fns[i]);
      if (r >= 0) out[i].push_back(s);
    }
  return out;
}

// The median of v (NaN when empty)
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The median over rounds r of a[r] / b[r]: the ratio of two things timed in the same rounds
inline double median_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratio;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) ratio.push_back(a[i] / b[i]);
  return median(ratio);
}

}  // namespace mf
