#include "core/bandwidth.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/timing.h"

namespace mf {
namespace {

// 16-byte lanes: SSE2's width, so the baseline build keeps every sum in a register
typedef uint64_t Lane __attribute__((vector_size(16)));
struct alignas(64) Line {
  Lane part[4];
};

Lane line_sum(const Line& l) { return (l.part[0] + l.part[1]) + (l.part[2] + l.part[3]); }

// the sum of lines [0, n) of p, read as four streams a quarter apart (the tail on its own)
uint64_t read_lines(const Line* p, int64_t n) {
  const int64_t q = n / 4;
  Lane a{}, b{}, c{}, d{};
  for (int64_t i = 0; i < q; ++i)
    a += line_sum(p[i]), b += line_sum(p[q + i]), c += line_sum(p[2 * q + i]), d += line_sum(p[3 * q + i]);
  for (int64_t i = 4 * q; i < n; ++i) a += line_sum(p[i]);
  const Lane s = a + b + c + d;
  return s[0] + s[1];
}

}  // namespace

double read_bandwidth_gbs() {
  constexpr int64_t lines = int64_t{4} << 20;  // 256 MB
  std::vector<Line> buffer(lines, Line{{Lane{} + 1, Lane{} + 1, Lane{} + 1, Lane{} + 1}});
  const int64_t threads = at::get_num_threads();
  std::atomic<uint64_t> sink{0};
  const double seconds = best_seconds(3, [&] {
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t first = lines * t / threads, last = lines * (t + 1) / threads;
        sink.fetch_add(read_lines(buffer.data() + first, last - first), std::memory_order_relaxed);
      }
    });
  });
  return static_cast<double>(lines * sizeof(Line)) / seconds / 1e9;
}

double copy_bandwidth_gbs() {
  auto a = at::rand({64 << 20}), b = at::empty_like(a);  // 256 MB each
  const double seconds = best_seconds(3, [&] { b.copy_(a); });
  return 2.0 * static_cast<double>(a.numel() * 4) / seconds / 1e9;
}

}  // namespace mf
