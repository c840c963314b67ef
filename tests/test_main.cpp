#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "core/runtime.h"
#include "core/util.h"
#include "methods/methods.h"

int main(int argc, char** argv) {
  mf::tune_process_environment(argv);  // the BLAS kernels and OpenMP waiting of the program itself
  mf::tune_allocator();
  mf::register_builtin_methods();
  ::testing::InitGoogleTest(&argc, argv);
  mf::set_compute_threads(1);  // ctest runs test processes in parallel
  mf::setup_logging(false);
  return RUN_ALL_TESTS();
}
