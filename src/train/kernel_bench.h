// `moeforge bench kernels`: each of our CPU kernels against the LibTorch composition it
// replaces, measured in the same run at a shape where it is used: best time of each, the
// speed-up, and the largest difference between their results (float32).
#pragma once
#include <string>
#include <vector>

namespace mf {

struct KernelBenchRow {
  std::string kernel, shape;
  double ours_s = 0, libtorch_s = 0;
  double max_abs_diff = 0;  // over every output (and gradient) the two produce
};

std::vector<KernelBenchRow> bench_kernels(int iters);

}  // namespace mf
