// Wall-clock timing for benchmarks.
#pragma once
#include <algorithm>
#include <chrono>

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

}  // namespace mf
