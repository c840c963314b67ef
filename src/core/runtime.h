// Process-level settings that decide CPU training speed (measured, see docs/benchmarks.md).
#pragma once
#include <cstdint>
#include <string>

namespace mf {

// Keeps freed memory in the heap instead of returning it to the OS: glibc serves large
// tensors with fresh mmap pages by default, and the page faults on every step cost more
// than the math (cross entropy over the vocabulary was ~20x slower). Call first thing.
void tune_allocator();
// Back to glibc's behaviour, for commands that stream tensors larger than memory one at a time
// (import, export): the kept blocks would otherwise add up to several gigabytes.
void streaming_allocator();
// streaming_allocator() while it lives, then the tuning it found: loading a model, whose conversion
// buffers would otherwise stay in the heap beside the weights (a bf16 model of 13.7 GB reached 24 GB).
class StreamingAllocatorScope {
 public:
  StreamingAllocatorScope();
  ~StreamingAllocatorScope();
  StreamingAllocatorScope(const StreamingAllocatorScope&) = delete;
  StreamingAllocatorScope& operator=(const StreamingAllocatorScope&) = delete;

 private:
  bool tuned_;
};

// Counts LibTorch operator calls (every dispatched ATen operator, nested ones included, on every
// thread) while it lives: what a decode step costs beyond its arithmetic (`bench generate`).
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  int64_t calls() const;

 private:
  uint64_t handle_;
  int64_t start_;
};

// Environment variables that libraries read only when they load, so they are set before a
// re-execution of the program (a variable the user set wins; returns if it cannot re-execute):
// - OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin after a parallel region steal the cores
//   OpenBLAS's own threads need.
// - OPENBLAS_CORETYPE: OpenBLAS picks its kernels from the CPU model CPUID names; a hypervisor
//   that reports a generic model (this project's VMs: "Intel Xeon Processor") gets the
//   Prescott (SSE3) kernels, 4-5x slower matrix products than the AVX-512 ones the CPU runs
//   (docs/benchmarks.md). The kernel family is named from the instruction sets instead.
// - OPENBLAS_THREAD_TIMEOUT=20: OpenBLAS's pthread workers spin (calling sched_yield) for 2^28
//   cycles, ~0.1 s, after each product before they sleep; between products LibTorch's OpenMP
//   threads then share the two cores with a spinning worker (a quarter of a quickstart training
//   step's samples were that spin). 2^20 cycles, ~0.4 ms, bridges the gaps between one layer's
//   products (docs/benchmarks.md).
void tune_process_environment(char** argv);

// The OpenBLAS kernel family for a CPU with these instruction sets: "SkylakeX" (AVX-512 F, CD,
// BW, DQ, VL), "Haswell" (AVX2 and FMA), or "" (leave OpenBLAS's own choice).
std::string openblas_coretype(bool avx512, bool avx2_fma);

// Intra-op threads of one worker: `requested` capped at the machine's cores, or with 0 the cores
// shared among the workers on this machine (LOCAL_WORLD_SIZE under `moeforge launch`): two
// one-thread ranks train a small model ~1.6x faster than one two-thread process (docs/benchmarks.md).
int64_t threads_per_worker(int64_t requested, int64_t cores, int64_t local_workers);
int64_t local_workers();  // LOCAL_WORLD_SIZE, or 1
// threads_per_worker on this machine: its cores and LOCAL_WORLD_SIZE
int64_t worker_threads(int64_t requested);
// at::set_num_threads, and the same for OpenBLAS where it is the BLAS: Debian's pthread
// OpenBLAS keeps its own pool of one thread per core otherwise, so two one-thread ranks ran
// four BLAS threads on two cores (a quarter of the run time in the kernel, waking them).
void set_compute_threads(int threads);
// set_compute_threads(threads_per_worker(0, ...)): every command's default. LibTorch's own
// default comes from cpuinfo, which finds 1 core on this project's VMs.
void use_shared_cores();
// OpenBLAS's threads set to n for a scope (then restored), for threads that each run their own
// GEMMs; a no-op where OpenBLAS is not the BLAS.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int n);
  ~ScopedBlasThreads();
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  int before_ = 0;
};

std::string runtime_summary();
// The git commit this binary was built from ("<12 hex>", "-dirty" appended when tracked files had
// uncommitted changes, "unknown" outside git); generated at build time by cmake/git_commit.cmake.
const char* build_commit();

// VmHWM of this process (0 where /proc is missing); reset_peak_rss() starts it again from
// the current RSS (Linux: /proc/self/clear_refs), so one process can measure several phases.
int64_t peak_rss_bytes();
void reset_peak_rss();  // for `moeforge doctor`

// Best of three n x n float32 matrix products, GFLOP/s: the machine's practical ceiling.
double sgemm_gflops(int64_t n);

}  // namespace mf
