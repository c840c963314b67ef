#include "core/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "core/simd.h"
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

StreamingAllocatorScope::StreamingAllocatorScope() : tuned_(g_allocator_tuned) { streaming_allocator(); }
StreamingAllocatorScope::~StreamingAllocatorScope() {
  if (tuned_) tune_allocator();
}

std::string openblas_coretype(bool avx512, bool avx2_fma) {
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

static SimdLevel cpu_simd_level() {
  SimdLevel cpu = SimdLevel::Base;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl")
              ? SimdLevel::Avx512
              : SimdLevel::Avx2;
#endif
  return cpu;
}

SimdLevel simd_level() {
  static const SimdLevel level = [] {
    const SimdLevel cpu = cpu_simd_level();
    const char* cap = std::getenv("MOEFORGE_SIMD");  // base | avx2 | avx512: at most this level
    if (!cap) return cpu;
    const std::string want = cap;
    if (want != "base" && want != "avx2" && want != "avx512") {
      spdlog::warn("MOEFORGE_SIMD={} is not base, avx2 or avx512; ignored", want);
      return cpu;
    }
    const SimdLevel asked = want == "base" ? SimdLevel::Base : want == "avx2" ? SimdLevel::Avx2 : SimdLevel::Avx512;
    return std::min(asked, cpu);
  }();
  return level;
}

int64_t threads_per_worker(int64_t requested, int64_t cores, int64_t local_workers) {
  cores = std::max<int64_t>(cores, 1);
  if (requested > 0) return std::min(requested, cores);
  return std::max<int64_t>(cores / std::max<int64_t>(local_workers, 1), 1);
}

int64_t local_workers() {
  const char* value = std::getenv("LOCAL_WORLD_SIZE");
  if (!value) return 1;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  return (end != value && *end == '\0' && n > 0) ? n : 1;
}

namespace {
using SetThreads = void (*)(int);
using GetThreads = int (*)();
SetThreads openblas_set_threads() {
  static auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return set;
}
}  // namespace

void set_compute_threads(int threads) {
  at::set_num_threads(threads);
  if (auto set = openblas_set_threads()) set(threads);
}

int64_t worker_threads(int64_t requested) {
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return threads_per_worker(requested, cores, local_workers());
}

void use_shared_cores() { set_compute_threads(static_cast<int>(worker_threads(0))); }

ScopedBlasThreads::ScopedBlasThreads(int n) {
  static auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!get || !openblas_set_threads()) return;
  before_ = get();
  openblas_set_threads()(n);
}

ScopedBlasThreads::~ScopedBlasThreads() {
  if (before_ > 0) openblas_set_threads()(before_);
}

void tune_process_environment(char** argv) {
  bool changed = false;
  auto set_unless_set = [&](const char* name, const std::string& value) {
    if (value.empty() || std::getenv(name) != nullptr) return;
    ::setenv(name, value.c_str(), 1);
    changed = true;
  };
  set_unless_set("OMP_WAIT_POLICY", "PASSIVE");
  set_unless_set("OPENBLAS_THREAD_TIMEOUT", "20");
  const auto level = cpu_simd_level();
  set_unless_set("OPENBLAS_CORETYPE", openblas_coretype(level == SimdLevel::Avx512, level != SimdLevel::Base));
  if (changed) ::execv("/proc/self/exe", argv);  // only returns on failure: then carry on as we are
}

// /proc/cpuinfo's first "model name" ("" where there is none)
static std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto value =
          line.find_first_not_of(" \t", line.find(':') == std::string::npos ? line.size() : line.find(':') + 1);
      return value == std::string::npos ? "" : line.substr(value);
    }
  return "";
}

std::string runtime_summary() {
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  // OpenBLAS's own report of the kernels it runs, where OpenBLAS is the BLAS
  using CoreName = char* (*)();
  auto core = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fmt::format(
      "CPU: {} | OMP_WAIT_POLICY={} | OpenBLAS kernels: {} | OPENBLAS_THREAD_TIMEOUT={} | heap keeps large blocks: {}",
      cpu_model().empty() ? "(unknown)" : cpu_model(), wait ? wait : "(unset)", core ? core() : "(not OpenBLAS)",
      timeout ? timeout : "(unset)", g_allocator_tuned ? "yes" : "no");
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

namespace {
std::atomic<int64_t> op_calls{0};
std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction&) {
  op_calls.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}
}  // namespace

OpCounter::OpCounter()
    : handle_(at::addGlobalCallback(at::RecordFunctionCallback(&count_op).scopes({at::RecordScope::FUNCTION}))),
      start_(op_calls.load()) {}
OpCounter::~OpCounter() { at::removeCallback(handle_); }
int64_t OpCounter::calls() const { return op_calls.load() - start_; }

}  // namespace mf
