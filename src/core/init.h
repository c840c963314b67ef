// Parameter initialisation at construction, and a scope that skips it: code that needs only a
// module's names and shapes (model_specs, parameter counts) builds blocks of models whose random
// initialisation would take minutes (a 600 M-parameter expert bank: ~10 s of randn).
#pragma once
#include <torch/torch.h>

namespace mf {

// While one is alive on this thread, init_normal allocates without initialising.
class ShapesOnly {
 public:
  ShapesOnly();
  ~ShapesOnly();
  ShapesOnly(const ShapesOnly&) = delete;
  ShapesOnly& operator=(const ShapesOnly&) = delete;

 private:
  bool outer_;
};

// N(0, std^2) of `shape` (float32, the global generator), or uninitialised under ShapesOnly.
torch::Tensor init_normal(at::IntArrayRef shape, double std);

}  // namespace mf
