// One table of our CPU kernels (ggml's test-backend-ops pattern). Each case builds its inputs
// at a shape, runs our kernel (`ours`) and the LibTorch composition it replaces (`reference`),
// both returning the output and, for trained kernels, the gradients, and counts its FLOPs.
//   tests (tests/train/test_kernel_cases.cpp): every case at its test shape, in float64 (ours
//     equals the reference to 1e-10 relative) and float32 (scale-relative error under
//     `tolerance`), on each SIMD level ctest runs (MOEFORGE_SIMD) and each units path the
//     machine has; a case the machine cannot run is reported, not skipped silently;
//   `moeforge bench kernels`: every case at its perf shape in float32, best times, GFLOP/s.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "core/table.h"

namespace mf {

struct KernelCase {
  KernelCase(std::string kernel, std::string shape, double flops, double tolerance)
      : kernel(std::move(kernel)), shape(std::move(shape)), flops(flops), tolerance(tolerance) {}
  std::string kernel, shape;
  double flops = 0;         // of one call of `ours` (multiply-adds count 2)
  double tolerance = 1e-5;  // float32: max|ours - ref| / max|ref| over each output
  bool runs = true;         // false: this machine cannot run it (`why`)
  std::string why;
  std::function<std::vector<at::Tensor>()> ours, reference;
};

enum class CaseSize { Test, Perf };
// Every case in `dtype` (float32 or float64), inputs seeded.
std::vector<KernelCase> kernel_cases(CaseSize size, at::ScalarType dtype);

// max over outputs of max|a - b| / max|b| (0 when b is all zero and a equals it)
double relative_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

// Every case at its perf shape in float32: best of `iters` times of ours and the reference,
// GFLOP/s, relative_error between them (rows: kernel, shape, flops, ours_s, libtorch_s, ...).
ResultTable bench_kernels(int iters);

}  // namespace mf
