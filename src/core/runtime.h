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

// OpenMP threads that spin after a parallel region steal the cores OpenBLAS's own
// threads need. libgomp reads OMP_WAIT_POLICY only at load time, so when it is unset
// this sets it to PASSIVE and re-executes the program (returns if it cannot).
void ensure_passive_openmp(char** argv);

std::string runtime_summary();

// VmHWM of this process (0 where /proc is missing); reset_peak_rss() starts it again from
// the current RSS (Linux: /proc/self/clear_refs), so one process can measure several phases.
int64_t peak_rss_bytes();
void reset_peak_rss();  // for `moeforge doctor`

// Best of three n x n float32 matrix products, GFLOP/s: the machine's practical ceiling.
double sgemm_gflops(int64_t n);

}  // namespace mf
