// Divergence checks: which tensor first holds a NaN or an infinity.
#pragma once
#include <stdexcept>
#include <string>

#include "io/safetensors.h"

namespace mf {

// A run stopped because a loss, gradient, weight or optimizer moment went non-finite.
struct DivergenceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The name of the first tensor (in order) with a NaN or infinity, "" when all are finite
// (undefined tensors are skipped). One device sync for the whole list.
std::string first_nonfinite(const NamedTensors& tensors);

// The gradients of `params` under the parameter names.
NamedTensors gradients(const NamedTensors& params);

}  // namespace mf
