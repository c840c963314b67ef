#include "core/runtime.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/timing.h"
#include "core/util.h"

namespace mf {

static bool g_allocator_tuned = false;

void tune_allocator() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  g_allocator_tuned = true;
}

void streaming_allocator() {
  mallopt(M_MMAP_MAX, 65536);          // glibc's defaults: large blocks are mapped
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // and unmapped when freed
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  g_allocator_tuned = false;
}

void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;  // the user's choice wins
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);  // only returns on failure: then carry on as we are
}

std::string runtime_summary() {
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  return fmt::format("OMP_WAIT_POLICY={} | heap keeps large blocks: {}", wait ? wait : "(unset)",
                     g_allocator_tuned ? "yes" : "no");
}

int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) {  // "VmHWM:  123 kB"
      const auto digits = line.substr(line.find_first_of("0123456789"));
      return parse_int(digits.substr(0, digits.find(' ')), "VmHWM") * 1024;
    }
  return 0;
}

void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

double sgemm_gflops(int64_t n) {
  auto a = at::randn({n, n}), b = at::randn({n, n});
  const double seconds = best_seconds(3, [&] { at::mm(a, b); });
  return 2.0 * static_cast<double>(n * n * n) / seconds / 1e9;
}

}  // namespace mf
